"""llminfer: run GGUF language models on the CPU, fast.

    import llminfer
    print(llminfer.system_info())
"""

from llminfer import errors, ops
from llminfer.system import system_info

__version__ = "0.1.0"

__all__ = ["errors", "ops", "system_info", "__version__"]
