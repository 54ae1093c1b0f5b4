"""CPU runtime defaults, applied before paddle is imported.

What each default buys is measured in docs/performance.md ("CPU runtime defaults") and bench/RESULTS.md; the reasons:
- MKL_DEBUG_CPU_TYPE=5 makes paddle's bundled MKL take its AVX2 path on AMD instead of a slow generic one.
  Set on AMD CPUs only: on an Intel Xeon it holds MKL back from its AVX-512 path.
- Contiguous kernels (FLAGS_use_stride_kernel off) make transpose/slice produce contiguous tensors; with
  paddle 3.3.1's default (strided views) the attention of paddleformers' Qwen2 spends most of a decode
  step copying strided views (bench/RESULTS.md, "Contiguous against stride kernels"; bench/bench_kernels.py).
  They are switched on only around the model's compute (`contiguous_kernels`), never globally: paddleformers'
  save_pretrained writes corrupt weights and its flex-checkpoint loader fails when stride kernels are off
  (tests/basics/test_runtime.py).
- glibc's malloc keeps freed memory for the next allocation (`_keep_freed_memory`): by default it hands every block
  over 32 MB back to the kernel when freed and takes fresh pages, zeroed one page fault at a time, for the next,
  and a policy update allocates and frees hundreds of such activations and gradients (bench/RESULTS.md, "The CPU's
  roofline, first part"; bench/bench_profile.py).
- Transparent huge pages for malloc's memory (`restart_with_huge_pages`, run_grpo.py's first act): after a policy update
  the heap is 13 GB of 4 KB pages, and a rollout's reads of its weights and KV cache spread over them ran 1.14-1.20x as
  long as in a fresh process; on 2 MB pages 0.94-1.10x (bench/RESULTS.md, "The step's other half, third part").
- OMP_NUM_THREADS = usable cores / processes on this node. paddle.distributed.launch exports
  OMP_NUM_THREADS=1 to its workers when the user set nothing, so under the launcher a value of 1 is
  taken as that default; set GRPO_CPU_THREADS to force a count.
Values the user already exported are kept.

The console of a run shows the run (tests/commands/test_console.py): paddle's and paddleformers' notices that say
nothing about it are filtered at their source here (see `_quiet_libraries`).
"""

import contextlib
import ctypes
import io
import logging
import os
import sys
import types
import warnings

from alignment import project_python_hint


def _threads_per_process() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    processes = int(os.environ.get("PADDLE_LOCAL_SIZE", "1"))
    return max(1, cores // max(1, processes))


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), "")
    except OSError:  # not Linux
        return ""


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"


def transparent_huge_pages_mode() -> str:
    """The kernel's THP mode: 'always' (huge pages unasked), 'madvise' (to memory that asks) or 'never'."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as modes:  # "always [madvise] never"
            return modes.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):  # not Linux, or a kernel without THP
        return "never"


def restart_with_huge_pages() -> None:
    """Run this process again (exec: the same PID, arguments and open files) with glibc's malloc asking the kernel for
    transparent huge pages (GLIBC_TUNABLES glibc.malloc.hugetlb=1: madvise on the heap as it grows), a setting glibc
    reads only when a process starts. Call it first, before anything is imported or printed. Nothing happens without
    glibc, where the kernel's THP is 'never', or where GLIBC_TUNABLES names glibc.malloc.hugetlb already (this
    restart's own mark; glibc.malloc.hugetlb=0 keeps 4 KB pages)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if HUGE_PAGES_TUNABLE in tunables or transparent_huge_pages_mode() == "never":
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
    except (ValueError, OSError):  # another C library
        return
    os.environ["GLIBC_TUNABLES"] = ":".join(part for part in (tunables, f"{HUGE_PAGES_TUNABLE}=1") if part)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def configure_cpu_runtime() -> None:
    forced = os.environ.get("GRPO_CPU_THREADS")
    launched = "PADDLE_LOCAL_SIZE" in os.environ
    if forced:
        os.environ["OMP_NUM_THREADS"] = forced
    elif "OMP_NUM_THREADS" not in os.environ or (launched and os.environ["OMP_NUM_THREADS"] == "1"):
        os.environ["OMP_NUM_THREADS"] = str(_threads_per_process())
    if _cpu_vendor() == "AuthenticAMD":
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    _keep_freed_memory()
    _quiet_libraries()


# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def _keep_freed_memory() -> None:
    """Blocks up to 1 GB come from malloc's heap rather than their own mapping, and the heap is not trimmed below
    2 GB of free space at its top: a freed activation's pages serve the next one. The process's resident memory
    then stays near its peak between steps instead of falling back (the peak itself is the same). Only with glibc,
    and not where the user set any of its MALLOC_*_ variables."""
    if not sys.platform.startswith("linux") or any(key.startswith("MALLOC_") and key.endswith("_") for key in os.environ):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # another C library (musl has no mallopt)
        return
    mallopt(M_MMAP_THRESHOLD, 1 << 30)
    mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)
    mallopt(M_TOP_PAD, 64 << 20)


def _quiet_libraries() -> None:
    """Library chatter that says nothing about this run; warnings and errors of substance still show."""
    # paddle's C++ INFO and WARNING lines: its TCP store connecting the processes, and a notice at the first call of a
    # compiled operator that writes in place that it also returns that output (csrc/ does so on purpose). ERROR and
    # FATAL lines still show; GLOG_minloglevel=1 exported shows the warnings, 0 the INFO lines too.
    os.environ.setdefault("GLOG_minloglevel", "2")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    warnings.filterwarnings("ignore", message="Setuptools is replacing distutils")
    warnings.filterwarnings("ignore", message="No ccache found")  # paddle looks for ccache at every import
    # fleet.init (sharding) makes size-1 groups for the parallelisms it does not use, and warns per group
    warnings.filterwarnings("ignore", message=r"Current global rank \d+ is not in group")
    # paddleformers announces at import that it hides PyTorch from transformers; this project never uses torch
    logging.getLogger("PaddleFormers").addFilter(lambda record: "is_torch_available" not in record.getMessage())


def import_paddle():
    """Import paddle after configure_cpu_runtime(), dropping its warning about OMP_NUM_THREADS > 1, which is
    the setting chosen on purpose. Without paddle: one line saying how to install it."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            import paddle
    except ModuleNotFoundError as e:
        if e.name != "paddle":
            raise
        install = ("`pip install -e '.[cpu]'` adds the CPU wheel; with a GPU, "
                   "`pip install paddlepaddle-gpu==3.3.1 -f https://www.paddlepaddle.org.cn/packages/stable/cu126/` (README)")
        hint = project_python_hint()  # the system python run where make's .venv is
        sys.exit(f"paddle is not installed in this environment{hint}, or install paddle here: {install}" if hint else
                 f"paddle is not installed in this environment: {install}")
    for line in captured.getvalue().splitlines():
        if "OMP_NUM_THREADS" not in line:
            print(line, file=sys.stderr)
    _report_only_flags_set_by_the_user()
    return paddle


class _PaddleOnFirstUse(types.ModuleType):
    """`paddle` bound, not loaded: the first use of one of its names loads it (import_paddle) and takes its names.
    (importlib's LazyLoader would load it at the next `import paddle`, which reads the module's __spec__.)"""

    def __getattr__(self, name):
        del sys.modules["paddle"]
        paddle = import_paddle()
        self.__dict__.update(paddle.__dict__)  # the modules that imported this one now reach paddle's names directly
        return getattr(paddle, name)


def import_paddle_lazily() -> None:
    """For run_grpo.py --help, whose option list imports the algorithm registries (modules that import paddle for
    their functions) and uses none of paddle: 0.4 s instead of 8 on 2 cores."""
    sys.modules.setdefault("paddle", _PaddleOnFirstUse("paddle"))


# Flags paddle 3.3 sets itself at import, which init_parallel_env reports as "Modified FLAGS detected".
PADDLE_OWN_FLAGS = {"FLAGS_enable_pir_in_executor"}


def _report_only_flags_set_by_the_user() -> None:
    from paddle.distributed import parallel

    report = getattr(parallel, "_print_modified_flags", None)  # a private function, which other versions may lack
    if report is not None:
        parallel._print_modified_flags = lambda flags: report([flag for flag in flags if flag.name not in PADDLE_OWN_FLAGS])


@contextlib.contextmanager
def contiguous_kernels():
    """Run the enclosed model compute with stride kernels off (see the module docstring)."""
    import paddle

    previous = paddle.get_flags(["FLAGS_use_stride_kernel"])["FLAGS_use_stride_kernel"]
    paddle.set_flags({"FLAGS_use_stride_kernel": False})
    try:
        yield
    finally:
        paddle.set_flags({"FLAGS_use_stride_kernel": previous})
