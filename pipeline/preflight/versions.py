"""Whether the installed torchvision works with the installed torch, named in one line before the run starts.

torchvision's compiled operators are built against one torch release; where pip could not reach the index a
pair came from (the CPU-only wheels, most often), it falls back to a torchvision of another torch, and the
first ``import torchvision`` fails deep inside its operator registrations (``operator torchvision::nms does
not exist``, a CUDA version mismatch), a traceback of 96 lines from the model's build. Here the import is
tried, its operators looked up, and the torch version torchvision's own metadata asks for compared with the
one installed; the line names both versions and the reinstall that pairs them.
"""

from __future__ import annotations

from importlib import metadata
from typing import List, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from pipeline.config.errors import one_line

FIX = ("install a matching pair from one index: pip install --force-reinstall torch torchvision --index-url "
       "https://download.pytorch.org/whl/cpu (or the index of your CUDA build)")


def installed(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def unmet_torch_requirements(torch_version: str, requires: List[str]) -> List[str]:
    """The requirements on torch among ``requires`` (a distribution's ``Requires-Dist``) that ``torch_version``
    does not meet; its local part (``+cpu``, ``+cu130``) aside, as pip compares them."""
    try:
        version = Version(Version(torch_version).base_version)
    except InvalidVersion:
        return []
    unmet = []
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name == "torch" and requirement.marker is None and not requirement.specifier.contains(
                version, prereleases=True):
            unmet.append(str(requirement))
    return unmet


def import_problem() -> Optional[str]:
    """Why ``import torchvision`` or its compiled operators fail here, or None."""
    try:
        import torch
        import torchvision  # noqa: F401 -- the import is the check

        torch.ops.torchvision.nms  # noqa: B018 -- registered by torchvision's compiled extension, where it loaded
    except Exception as exc:  # noqa: BLE001 -- what a mismatched build raises varies: RuntimeError, AttributeError
        return f"importing it fails ({type(exc).__name__}: {one_line(exc)[:200]})"
    return None


def torchvision_problem() -> Optional[str]:
    """One line naming torch's and torchvision's versions and the fix, where torchvision is installed and does not
    work with this torch; else None."""
    vision, torch_version = installed("torchvision"), installed("torch")
    if vision is None or torch_version is None:
        return None
    why = import_problem()
    unmet = unmet_torch_requirements(torch_version, metadata.requires("torchvision") or [])
    if why is None and not unmet:
        return None
    asks = f"it requires {', '.join(unmet)}" if unmet else ""
    return (f"torchvision {vision} does not work with torch {torch_version}: "
            f"{'; '.join(filter(None, [why, asks]))}; {FIX}")
