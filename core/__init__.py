"""bertzoo: small BERT-family encoders from a research idea to a production service.

This top-level package is the torch-free core shared by every stage: tokenization, task definitions (labels, metrics,
pre- and post-processing), data formats, backbone resolution and the checkpoint files. The trainer lives in
``bertzoo.trainer`` (folder ``trainer/``), export in ``bertzoo.export`` and serving in ``bertzoo.serving``.
"""

__version__ = "0.1.0"
