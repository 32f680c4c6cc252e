"""Build the CUDA extension (kernels/csrc) when CUDA is available; otherwise say what was skipped and why.

python -m weaver_kernels.build
"""

from __future__ import annotations

import argparse
import sys

from weaver_kernels import cuda_ext


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="print the compiler commands and output")
    parser.add_argument(
        "--require", action="store_true", help="exit with status 1 instead of 0 when the build has to be skipped"
    )
    args = parser.parse_args(argv)
    reason = cuda_ext.unavailable_reason()
    if reason is not None:
        print(f"weaver_kernels.build: SKIPPED the CUDA extension {cuda_ext.NAME}: {reason}.")
        print("weaver_kernels.build: the Triton kernels and the PyTorch references need no build step.")
        return 1 if args.require else 0
    module = cuda_ext.load(verbose=args.verbose)
    print(f"weaver_kernels.build: BUILT {cuda_ext.NAME} from {', '.join(s.name for s in cuda_ext.SOURCES)}")
    print(f"weaver_kernels.build: module {module.__file__} in {cuda_ext.BUILD_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
