"""Build the fused rollout operators into csrc/build/grpo_ops/grpo_ops.so.

    .venv/bin/python csrc/build.py      (what `make ops` runs)

alignment/kernels/ops.py loads the result and never compiles at run time. The CUDA sources are
compiled only when paddle itself is built with CUDA; the CPU build needs no nvcc.
"""

import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CSRC = Path(__file__).resolve().parent
BUILD_DIR = CSRC / "build"
NAME = "grpo_ops"
# -fno-trapping-math: without it GCC 12 vectorises no loop that calls exp_nonpos on a CPU without AVX-512 (its
# clamp's compare may raise an FP exception, so it stays a branch); the kernels never read the FP exception flags.
CXX_FLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-fopenmp", "-std=c++17"]
# The .cu files register no ops, so they skip paddle's Python bindings (PADDLE_NO_PYTHON), whose
# headers would also pull in cuBLAS.
CUDA_FLAGS = ["-O3", "-DGRPO_WITH_CUDA", "-DPADDLE_NO_PYTHON", "--expt-relaxed-constexpr"]


def missing_openmp_entry_points(library: Path, runtime: Path) -> list:
    """The GOMP_* functions `library` calls that `runtime` (paddle's libiomp5) does not define. GCC emits such calls
    for OpenMP constructs; one libiomp5 lacks (GOMP_loop_nonmonotonic_dynamic_*, from schedule(dynamic)) binds to the
    libgomp paddle also loads, whose loop knows nothing of libiomp5's thread team, so every thread runs every
    iteration: grpo_sample drew each row once per thread until this check found it. Uses binutils' nm."""

    def symbols(path: Path, which: str) -> set:
        listing = subprocess.run(["nm", "-D", which, str(path)], capture_output=True, text=True, check=True).stdout
        return {line.split()[-1].split("@")[0] for line in listing.splitlines() if line.strip()}

    called = {name for name in symbols(library, "--undefined-only") if name.startswith("GOMP_")}
    return sorted(called - symbols(runtime, "--defined-only"))


def main() -> None:
    sys.path.insert(0, str(CSRC.parent))
    from alignment.basics.runtime import configure_cpu_runtime, import_paddle

    configure_cpu_runtime()
    paddle = import_paddle()
    from paddle.utils.cpp_extension import load

    sources = sorted(glob.glob(str(CSRC / "*.cc")))
    cxx_flags = list(CXX_FLAGS)
    if paddle.is_compiled_with_cuda():
        sources += sorted(glob.glob(str(CSRC / "*.cu")))
        cxx_flags.append("-DGRPO_WITH_CUDA")
    else:
        print("paddle is a CPU build: skipping the CUDA sources (csrc/*.cu)")
    # Always a clean build: paddle's incremental check hashes the .cc/.cu files but not grpo_ops.h.
    shutil.rmtree(BUILD_DIR / NAME, ignore_errors=True)
    BUILD_DIR.mkdir(exist_ok=True)
    began = time.perf_counter()
    # Link the OpenMP runtime paddle already runs (its MKL's libiomp5, which also serves GCC's GOMP_*
    # calls) instead of GCC's libgomp: two runtimes would each keep threads spinning on the same cores,
    # and on 2 cores every parallel region of ours then waited about 10 ms for a time slice.
    paddle_libs = Path(paddle.__file__).parent / "libs"
    openmp = ["-fopenmp"]
    if (paddle_libs / "libiomp5.so").is_file():
        openmp = [f"-L{paddle_libs}", "-liomp5", f"-Wl,-rpath,{paddle_libs}"]
    # The packed-weight matmul (grpo_gemm.cc) calls the MKL paddle ships; without it that file is empty.
    if (paddle_libs / "libmklml_intel.so").is_file():
        cxx_flags.append("-DGRPO_WITH_MKL")
        openmp += [f"-L{paddle_libs}", "-lmklml_intel", f"-Wl,-rpath,{paddle_libs}"]
    else:
        print(f"no libmklml_intel.so in {paddle_libs}: building without the packed-weight matmul")
    # The bf16 matmuls (grpo_bf16.cc) call the oneDNN paddle ships; without it that file is empty.
    if (paddle_libs / "libdnnl.so.3").is_file():
        cxx_flags.append("-DGRPO_WITH_DNNL")
        openmp += [f"-L{paddle_libs}", "-l:libdnnl.so.3", f"-Wl,-rpath,{paddle_libs}"]
    else:
        print(f"no libdnnl.so.3 in {paddle_libs}: building without the bf16 matmuls")
    load(
        name=NAME,
        sources=sources,
        extra_cxx_cflags=cxx_flags,
        extra_cuda_cflags=CUDA_FLAGS,
        extra_ldflags=openmp,
        extra_include_paths=[str(CSRC)],
        build_directory=str(BUILD_DIR),
        verbose=os.environ.get("GRPO_BUILD_VERBOSE") == "1",
    )
    library = BUILD_DIR / NAME / f"{NAME}.so"
    if not library.is_file():
        raise SystemExit(f"build finished but {library} is missing")
    missing = missing_openmp_entry_points(library, paddle_libs / "libiomp5.so") if "-liomp5" in openmp else []
    if missing:
        library.unlink()
        raise SystemExit(
            f"{library.name} calls OpenMP entry points paddle's libiomp5 lacks: {', '.join(missing)}; libgomp would "
            "run them and every thread would run every iteration. Use schedule(static) or monotonic:dynamic there."
        )
    names = ", ".join(Path(s).name for s in sources)
    print(f"built {library.relative_to(CSRC.parent)} from {names} in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
