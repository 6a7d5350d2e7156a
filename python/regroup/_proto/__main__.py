"""``python -m regroup._proto [--force]``: regenerate wire_pb2.py from the .proto."""

import sys

from regroup._proto import generate

print("regenerated" if generate(force="--force" in sys.argv) else "up to date")
