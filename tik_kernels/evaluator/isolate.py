"""The sandbox's launcher: `python -I -S isolate.py SPEC.json`, started by `sandbox._popen`.

Standard library only (it runs with -I -S, before and outside the child's environment). It reads the
spec the trusted parent wrote, then either execs the child directly (`"namespaces": false`, the
explicit `--unsafe-no-sandbox`) or builds a jail and runs the child inside it:

    launcher (this process, parent's namespaces; kept so the parent's pid, timeout kill and exit status work)
      └ holder: unshare(user, mount, pid, net, ipc, uts); the launcher writes its uid/gid maps
          └ init: pid 1 of the new pid namespace; builds the mount tree, pivot_root, forks the child and waits
              └ child: no capabilities, no_new_privs; execs `python -m tik_kernels.evaluator.child /tmp`

Lifetime: every link dies with its parent (PR_SET_PDEATHSIG = SIGKILL, set before anything else runs),
and when init dies the kernel kills every process left in its pid namespace: a grandchild the candidate
forked, daemonized or not, cannot outlive the evaluation, nor the evaluator process.

Mounts (`spec`): a tmpfs root, read-only bind mounts of the system and Python directories, the child
runtime and the implementation files; the scratch directory read-write at /tmp; the device nodes named;
a fresh /proc of the new pid namespace (the parent's processes do not exist there). The child runs as
an unprivileged uid (65534 when the evaluator is root, else the evaluator's own uid) with no
capabilities, so it cannot remount anything writable. The network namespace has only a loopback
interface, down.

A failure to build the jail exits 125 with one line `tik-sandbox: ...` on stderr.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1 << 10, 1 << 11, 1 << 12, 1 << 14, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203}.get(platform.machine())
#: per-mount flags a remount must keep (in a user namespace, dropping a locked one is refused)
KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
#: the uid and gid the child runs as when the evaluator is root ("nobody")
NOBODY = 65534
SETUP_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(e)}")


def _b(s):
    return None if s is None else os.fsencode(s)


def mount(src, target, fstype, flags, data=None) -> None:
    _check(libc.mount(_b(src), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)), f"mount {target}")


def prctl(option: int, arg: int) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def die_with_parent() -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# ----------------------------------------------------------------------------- the mount tree


def _mkpath(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _bind(root: str, src: str, dst: str) -> None:
    target = root + dst
    _mkpath(target, os.path.isdir(src))
    mount(src, target, None, MS_BIND | MS_REC)


def remount(point: str, opts: set[str], flags: int) -> None:
    """Remount the bind mount at `point` with `flags`, keeping the per-mount flags it has (`opts`, from
    `_mounts_under`): a flag inherited from an outer namespace is locked, and a remount that drops it is refused."""
    for o in opts:
        flags |= KEEP.get(o, 0)
    mount(None, point, None, MS_REMOUNT | MS_BIND | flags)


def fresh_shm(target: str) -> None:
    """An empty /dev/shm of its own at `target`: no shared memory with any other process's."""
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")


def _mounts_under(root: str) -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount at or below `root`, parents first."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 etc.
            if point == root or point.startswith(root + "/"):
                out.append((point, set(fields[5].split(","))))
    return out


def build_root(spec: dict) -> None:
    """The child's file system, under spec["root"], then pivot_root into it."""
    root = spec["root"]
    os.umask(0o022)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    for src, dst in spec["ro"]:
        _bind(root, src, dst)
    writable = set()
    for src, dst in spec["rw"]:
        _bind(root, src, dst)
        writable.add(root + dst)
    for target, link in spec["symlinks"]:
        os.symlink(target, root + link)
    # /dev: only the nodes named (a device node on a tmpfs made here would not open: nodev in a user namespace)
    os.makedirs(root + "/dev")
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=1m")
    devices = set()
    for dev in spec["devices"]:
        _bind(root, dev, dev)
        devices.add(root + dev)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/dev/shm")
    fresh_shm(root + "/dev/shm")
    writable.add(root + "/dev/shm")
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in spec["hide"]:
        if os.path.isdir(root + path):
            mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    # read-only everywhere else, submounts included (a recursive bind brings them along writable); nosuid
    for point, opts in _mounts_under(root):
        if point in devices or point == root or point == root + "/proc":
            continue
        remount(point, opts, MS_NOSUID | (MS_NODEV if point in writable else MS_RDONLY))
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    if SYS_PIVOT_ROOT is None:
        raise SetupError(f"pivot_root: unknown syscall number on {platform.machine()}")
    # pivot_root(".", "."): the old root is stacked under the new one, then detached
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount the old root")
    os.chdir("/")


# ----------------------------------------------------------------------------- the processes


def exec_child(spec: dict) -> None:
    """Become the child: no new privileges, die with the parent, exec Python (no capabilities survive: the
    uid is not root in its namespace)."""
    if spec["uid_mode"] == "nobody":
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    die_with_parent()
    os.chdir(spec["cwd"])
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def init(spec: dict, status_w: int) -> None:
    """pid 1 of the new pid namespace: build the jail, run the child, report its wait status. Returning
    (the caller exits) kills whatever the child left behind in the namespace."""
    try:
        die_with_parent()
        build_root(spec)
    except (SetupError, OSError) as e:
        os.write(status_w, f"E{e}".encode())
        return
    pid = os.fork()
    if pid == 0:
        try:
            exec_child(spec)
        finally:
            os._exit(127)
    while True:
        got, status = os.wait()
        if got == pid:
            os.write(status_w, f"S{status}".encode())
            return


def write_maps(pid: int, mode: str) -> None:
    """uid/gid maps of the holder's user namespace: one unprivileged id inside (see the module doc)."""
    euid, egid = os.geteuid(), os.getegid()
    if mode == "nobody":
        # root (CAP_SETUID in the parent namespace) maps itself, to build the jail, and nobody, for the child
        uid_map = gid_map = f"0 0 1\n{NOBODY} {NOBODY} 1"
    else:  # any user may map its own ids; root's 0 appears as nobody inside, never as root
        uid_map = f"{euid or NOBODY} {euid} 1"
        gid_map = f"{egid if euid else NOBODY} {egid} 1"
    for name, data in (("setgroups", "deny"), ("uid_map", uid_map), ("gid_map", gid_map)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(data)


def jail(spec: dict) -> int:
    """Run the child in new namespaces; its wait status, or raise SetupError."""
    if os.geteuid() == 0:
        try:
            os.setgroups([])  # root's supplementary groups must not reach the child
        except OSError as e:  # root of a user namespace that denies setgroups: then its groups are its own
            if spec["uid_mode"] == "nobody":
                raise SetupError(f"setgroups: {e.strerror}") from None
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    status_r, status_w = os.pipe()
    holder = os.fork()
    if holder == 0:
        code = SETUP_FAILED
        try:
            os.close(ready_r)
            os.close(go_w)
            os.close(status_r)
            die_with_parent()
            flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
            if libc.unshare(flags) != 0:
                os.write(ready_w, f"unshare: {os.strerror(ctypes.get_errno())}".encode())
                os._exit(SETUP_FAILED)
            os.write(ready_w, b"ok")
            if os.read(go_r, 16) != b"go":
                os._exit(SETUP_FAILED)
            pid = os.fork()  # the first child in the new pid namespace is its init
            if pid == 0:
                try:
                    init(spec, status_w)
                finally:
                    os._exit(0)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code if code >= 0 else SETUP_FAILED)
    os.close(ready_w)
    os.close(go_r)
    os.close(status_w)
    msg = os.read(ready_r, 512).decode(errors="replace")
    if msg != "ok":
        os.waitpid(holder, 0)
        raise SetupError(msg or "the namespace holder died")
    try:
        write_maps(holder, spec["uid_mode"])
    except OSError as e:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
        raise SetupError(f"uid map ({spec['uid_mode']}): {e.strerror}") from None
    os.write(go_w, b"go")
    os.waitpid(holder, 0)
    report = b""
    while chunk := os.read(status_r, 512):
        report += chunk
    text = report.decode(errors="replace")
    if text.startswith("E"):
        raise SetupError(text[1:])
    if text.startswith("S"):
        return int(text[1:])
    # init was killed before the child ended (the timeout kill, the OOM killer)
    raise SetupError("the namespace's init died")


def mimic(status: int) -> None:
    """Exit the way the child did: its exit code, or its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        die_with_parent()
        # the evaluator may have died before the line above: then nothing is started
        if os.getppid() != spec["owner_pid"]:
            os._exit(SETUP_FAILED)
        if not spec["namespaces"]:
            os.chdir(spec["cwd"])
            os.execve(spec["argv"][0], spec["argv"], spec["env"])
        mimic(jail(spec))
    except (SetupError, OSError) as e:
        msg = f"{e.strerror}" + (f": {e.filename}" if e.filename else "") if isinstance(e, OSError) else str(e)
        sys.stderr.write(f"tik-sandbox: {msg}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)


if __name__ == "__main__":
    main()
