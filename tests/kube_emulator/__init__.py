"""An in-repo Kubernetes API emulator for tests (not shipped with gagar).

See :class:`KubeEmulator` (server, kubeconfig, Python-side controls), :mod:`.kopf_runner`
(the real kopf runtime in a thread against the emulator) and :mod:`.fixtures` (pytest fixtures).
"""

from .emulator import KubeEmulator
from .errors import ApiError
from .faults import Rule

__all__ = ["ApiError", "KubeEmulator", "Rule"]
