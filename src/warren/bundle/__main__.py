"""`python3 -m warren.bundle verify|extract|images`: the bundle's checks with the standard library only.

For the first host of an air gap, where nothing is installed yet: take the warren wheel out
of the archive and put it on the path (docs/air-gapped.md):

    PYTHONPATH=wheels/warren-0.1.0-py3-none-any.whl python3 -m warren.bundle verify FILE

Everywhere else use `warren bundle verify|extract`, which run the same code. `images` prints,
as JSON, the service images an extracted bundle carries for a configuration's workloads
(service -> name, digest, archive), or fails naming what is missing: preflight's check that
the bundle suits the configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from warren.bundle import BundleError
from warren.bundle.extract import extract
from warren.bundle.images import WORKLOAD_IMAGES, workload_images
from warren.bundle.verify import verify


def _progress(message: str) -> None:
    print(f"· {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python3 -m warren.bundle", description=summary)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="check an archive or an extracted bundle against its manifest")
    check.add_argument("target", type=Path)
    unpack = commands.add_parser("extract", help="verify, then extract into a new or empty directory")
    unpack.add_argument("archive", type=Path)
    unpack.add_argument("dest", type=Path)
    images = commands.add_parser("images", help="the service images an extracted bundle carries, as JSON")
    images.add_argument("bundle", type=Path)
    images.add_argument("--tag", required=True, help="services.image_tag")
    images.add_argument("--stores", choices=sorted(WORKLOAD_IMAGES), required=True, help="services.stores")
    args = parser.parse_args(argv)
    try:
        if args.command == "images":
            found = workload_images(args.bundle, args.tag, args.stores)
            described = {
                image.service: {"name": image.name, "digest": image.digest, "archive": str(image.archive)}
                for image in found
            }
            print(json.dumps(described))
            return 0
        if args.command == "verify":
            report = verify(args.target, _progress)
            print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
            return 0 if report.ok else 1
        outcome, report = extract(args.archive, args.dest, _progress)
    except BundleError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.dest}: {outcome.value} ({report.checked_files} files verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
