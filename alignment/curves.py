"""Pictures of a run: `python -m alignment.curves OUTPUT_DIR` reads OUTPUT_DIR/metrics.jsonl and writes
OUTPUT_DIR/curves.png (alignment/storage/curves.py draws it)."""

import argparse

from alignment.storage.curves import plot_curves


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="curves", usage="python -m alignment.curves [-h] OUTPUT_DIR", description="Plot a run's metrics.jsonl into curves.png."
    )
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="a run's output_dir, holding metrics.jsonl")
    args = parser.parse_args(argv)
    try:
        print(plot_curves(args.output_dir))
    except (OSError, ValueError) as e:
        parser.error(str(e))  # "curves: error: ...", exit status 2


if __name__ == "__main__":
    main()
