"""``python -m bertzoo.export.ort_kernel``: build the native SparsegenLin kernel here and print its path (for a
Triton host's ``model_operations { op_library_filename: ... }``, or to warm the cache in a container image)."""

import sys

from . import library, unavailable_reason

path = library()
if path is None:
    sys.exit(f"the SparsegenLin kernel cannot be built here: {unavailable_reason()}")
print(path)
