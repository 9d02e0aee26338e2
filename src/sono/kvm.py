"""Can a microVM boot on this host? The facts ``-s microvm`` and ``so doctor`` rely on.

microsandbox boots each sandbox as a libkrun microVM: on Linux through ``/dev/kvm``, which
must be backed by hardware virtualization (VT-x through ``kvm_intel``, AMD-V through
``kvm_amd``); on macOS through Hypervisor.framework on Apple Silicon. A ``/dev/kvm`` that
comes from ``kvm_pvm`` (paravirtual KVM, made for clouds that give no VT-x to their VMs)
is not enough: guest user code runs natively there, but every guest-kernel instruction
goes through KVM's instruction emulator, and libkrunfw's kernel dies at the first one the
emulator lacks (``KVM_EXIT_INTERNAL_ERROR``) — so the VM would never come up.

Everything is read under a ``root`` seam (``dev/kvm``, ``proc/modules``,
``sys/module/*``, ``proc/cpuinfo``) and the runtime lookup is injectable, so the tests
fake each host situation in a temporary directory. Nothing here imports the SDK.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VENDOR_MODULES = {"kvm_intel": "vmx", "kvm_amd": "svm"}
PVM_MODULE = "kvm_pvm"
PIN = "microsandbox==0.7.11"


@dataclass(frozen=True)
class Runtime:
    """microsandbox's host runtime: the ``msb`` binary and the libkrunfw it loads."""

    msb: Path | None
    libkrunfw: Path | None
    where: str = ""  # where it was looked for, for the reason when something is missing


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str


RuntimeFinder = Callable[[], Runtime]


def find_runtime() -> Runtime:
    """``MSB_PATH``/``MSB_LIBKRUNFW_PATH`` when set (microsandbox's own overrides), else the
    pair the ``microsandbox`` wheel bundles — found without importing the SDK."""
    msb_env = os.environ.get("MSB_PATH")
    lib_env = os.environ.get("MSB_LIBKRUNFW_PATH")
    spec = importlib.util.find_spec("microsandbox")
    origin = spec.origin if spec is not None else None
    bundled = Path(origin).parent / "_bundled" if origin else None
    msb = Path(msb_env) if msb_env else (bundled / "bin" / "msb" if bundled else None)
    if lib_env:
        lib: Path | None = Path(lib_env)
    elif msb is not None:
        # The resolver looks next to msb (../lib/), which is the wheel's layout.
        libs = sorted((msb.parent.parent / "lib").glob("libkrunfw*"))
        lib = libs[-1] if libs else None
    else:
        lib = None
    where = f"MSB_PATH={msb_env}" if msb_env else (str(bundled) if bundled else "")
    return Runtime(
        msb if msb is not None and msb.is_file() else None,
        lib if lib is not None and lib.is_file() else None,
        where,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def loaded_modules(root: Path = Path("/")) -> set[str]:
    """KVM-related modules present: ``/proc/modules`` (loadable ones) and
    ``/sys/module`` (built-in ones show up there too, when they have parameters)."""
    found = {line.split()[0] for line in _read(root / "proc/modules").splitlines() if line.split()}
    sys_module = root / "sys/module"
    for name in ("kvm", PVM_MODULE, *VENDOR_MODULES):
        if (sys_module / name).is_dir():
            found.add(name)
    return {m for m in found if m == "kvm" or m.startswith("kvm_")}


def cpu_flags(root: Path = Path("/")) -> set[str]:
    flags: set[str] = set()
    for line in _read(root / "proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def boot_support(
    root: Path = Path("/"),
    *,
    runtime: RuntimeFinder = find_runtime,
    system: str | None = None,
    machine: str | None = None,
) -> Support:
    """Whether a microsandbox microVM can boot here, and precisely why (not)."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system == "Darwin":
        if machine not in ("arm64", "aarch64"):
            return Support(
                False, f"macOS on {machine}: microsandbox boots VMs on Apple Silicon only"
            )
        host = "macOS on Apple Silicon (Hypervisor.framework)"
    elif system == "Linux":
        kvm = _linux_kvm(root)
        if not kvm.ok:
            return kvm
        host = kvm.reason
    else:
        return Support(False, f"{system}: so's microVM backend supports Linux (KVM) and macOS")
    rt = runtime()
    where = f" (looked in {rt.where})" if rt.where else ""
    if rt.msb is None:
        return Support(
            False,
            f"the microsandbox runtime is missing: no msb binary{where}; "
            f"install the SDK that bundles it: pip install {PIN}",
        )
    if rt.libkrunfw is None:
        return Support(
            False,
            f"the microsandbox runtime is incomplete: msb at {rt.msb} but no libkrunfw next "
            f"to it; reinstall {PIN} (or set MSB_LIBKRUNFW_PATH)",
        )
    return Support(True, f"{host}; runtime {rt.msb}")


def _linux_kvm(root: Path) -> Support:
    """What backs /dev/kvm (``ok``), or why a VM cannot boot on it."""
    kvm = root / "dev/kvm"
    if not kvm.exists():
        return Support(
            False,
            "no /dev/kvm: this host offers no KVM (load kvm_intel or kvm_amd; inside a VM, "
            "enable nested virtualization)",
        )
    modules = loaded_modules(root)
    flags = cpu_flags(root)
    vendor = sorted(m for m in VENDOR_MODULES if m in modules)
    if PVM_MODULE in modules and not vendor:
        return Support(
            False,
            "/dev/kvm exists but comes from kvm_pvm (paravirtual KVM without VT-x/AMD-V): "
            "libkrunfw's guest kernel cannot boot under its instruction emulator",
        )
    hardware = sorted(flag for flag in VENDOR_MODULES.values() if flag in flags)
    if not hardware:
        inside = " (this host is itself a VM without nested virtualization)"
        return Support(
            False,
            "/dev/kvm exists but the CPU shows no vmx/svm flag: KVM without hardware "
            "virtualization cannot run libkrunfw's guest kernel"
            + (inside if "hypervisor" in flags else ""),
        )
    if not os.access(kvm, os.R_OK | os.W_OK):
        return Support(
            False,
            f"/dev/kvm is not readable and writable by uid {os.getuid()}: add the user to "
            "the group owning /dev/kvm (usually kvm) and log in again",
        )
    via = vendor[0] if vendor else "KVM"
    return Support(True, f"/dev/kvm from {via} with {'/'.join(hardware)}")
