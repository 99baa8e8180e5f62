"""The seccomp profile every sandbox gets, in OCI runtime-spec form.

Generated here rather than taken from a distribution package (containers-common's default
allows ``unshare`` and ``mount``). The profile allows ordinary process work and refuses, with
``EPERM``, every call that would let a worker leave or reshape its sandbox: new namespaces,
mounts, kernel keyrings, tracing, BPF, module loading, clock and host administration calls.
It is a deny list over a default of allow (documented in docs/compliance.md): an allow list
is stricter but breaks whenever a Python wheel's native code needs one more call.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AF_VSOCK", "CLONE_NEW_FLAGS", "DENIED_SYSCALLS", "ENOSYS", "EPERM", "seccomp_profile"]

EPERM = 1

DENIED_SYSCALLS: tuple[str, ...] = (
    # leaving or reshaping the sandbox
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsmount",
    "fsconfig",
    "move_mount",
    "open_tree",
    # kernel keyrings
    "keyctl",
    "add_key",
    "request_key",
    # looking into other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    # kernel attack surface
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "lookup_dcookie",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    # host administration
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "syslog",
    "vhangup",
    "nfsservctl",
)


# Namespace flags of clone(2): a thread or a fork is fine, a new namespace is not.
CLONE_NEW_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)
ENOSYS = 38
# vsock talks to the hypervisor (or a host's vhost-vsock) whatever the network namespace says
AF_VSOCK = 40


def seccomp_profile() -> dict[str, Any]:
    """The ``linux.seccomp`` object of an OCI runtime spec (x86-64 and its compat arches).

    Besides the deny list: ``clone`` with any ``CLONE_NEW*`` flag is refused (the flags are a
    register argument a filter can read), ``clone3`` answers ``ENOSYS`` (its flags sit in memory
    a filter cannot read; libc then falls back to ``clone``), ``io_uring`` is refused, and so is
    a ``socket`` or ``socketpair`` of family ``AF_VSOCK`` (outside the network namespace).
    """
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
            *(  # one rule per flag: the arguments of one rule must all match
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": EPERM,
                    "args": [
                        {"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}
                    ],
                }
                for flag in CLONE_NEW_FLAGS
            ),
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
            {
                "names": ["socket", "socketpair"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ"}],
            },
            {
                "names": ["io_uring_setup", "io_uring_enter", "io_uring_register"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
            },
        ],
    }
