"""The NLTK data the instruction verifiers read, installed at install time from a registry package, never fetched at run time.

IFEval's and IFBench's verifiers split sentences with NLTK's Punkt model (punkt_tab) and IFBench's read NLTK's English
stop words. NLTK's own downloader fetches these from GitHub when a program first needs them; this project installs them
once, with `make venv` or `python -m alignment.rewards.nltk_resources`, from the wheel of llama-index-core (PyPI, MIT), which
carries NLTK's files unchanged, into <the environment>/nltk_data, a folder NLTK searches by default. IFBench's
`words:start_verb` also needs NLTK's part-of-speech tagger, which no registry package carries: rows with that
instruction are refused (naming the command to install the tagger where the internet can be reached).
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (NLTK resource path, the English files it needs): what nltk.data.find looks for
ENGLISH_FILES = {
    "tokenizers/punkt_tab": ("english/abbrev_types.txt", "english/collocations.tab", "english/ortho_context.tab",
                             "english/sent_starters.txt"),
    "corpora/stopwords": ("english", "README"),
}
TAGGER = "taggers/averaged_perceptron_tagger_eng"
SOURCE_WHEEL = "llama-index-core==0.14.25"  # its llama_index/core/_static/nltk_cache holds NLTK's punkt_tab and stopwords
SOURCE_FOLDER = "llama_index/core/_static/nltk_cache/"
INSTALL_COMMAND = "python -m alignment.rewards.nltk_resources (make venv runs it)"


def default_target() -> Path:
    return Path(sys.prefix) / "nltk_data"


def missing(resources) -> list:
    """The resource paths among `resources` that NLTK cannot find."""
    import nltk

    absent = []
    for resource in resources:
        try:
            nltk.data.find(resource)
        except LookupError:
            absent.append(resource)
    return absent


def install(target: Path, wheel_folder: Path | None = None) -> list:
    """Fetch SOURCE_WHEEL with pip (no dependencies, nothing installed) and copy the English files into target."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = wheel_folder or Path(scratch)
        if wheel_folder is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder), SOURCE_WHEEL],
                           check=True)
        wheel = next(folder.glob("llama_index_core-*.whl"))
        written = []
        with zipfile.ZipFile(wheel) as archive:
            for resource, names in ENGLISH_FILES.items():
                for name in names:
                    destination = target / resource / name
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(f"{SOURCE_FOLDER}{resource}/{name}") as source, open(destination, "wb") as out:
                        shutil.copyfileobj(source, out)
                    written.append(destination)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignment.rewards.nltk_resources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=default_target(),
                        help="the nltk_data folder to write (default: <this environment>/nltk_data, searched by NLTK)")
    args = parser.parse_args(argv)
    written = install(args.target)
    print(f"nltk_resources: wrote {len(written)} files of NLTK's English punkt_tab and stopwords under {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
