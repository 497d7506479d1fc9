"""bertzoo's benchmarks: each maintained script runs from the checkout's root as ``python -m benchmarks.NAME``
(README.md here lists them); ``benchmarks.common`` holds what they share."""
