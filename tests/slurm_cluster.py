"""A real Slurm on this machine for the tests: munged, slurmctld and two slurmd ("nodes" tgn1 and tgn2 sharing
this host), from Debian's packages (.ci/run installs slurmctld, slurmd, slurm-client and munge).

    with SlurmCluster(tmp_path) as cluster:
        job = cluster.sbatch(script_text, "--time=1")
        cluster.wait_state(job, "RUNNING")

Everything lives in one folder (config, state, spool, logs, the munge key and socket) and on ports picked
free; the daemons run as the user (root in CI: slurmd must start jobs as their owner). `unavailable()` says
why it cannot start (binaries missing, not root), so the tests skip with that reason, never silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue")
NODES = ("tgn1", "tgn2")


def unavailable() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        return f"Slurm is not installed here (missing {', '.join(missing)}; .ci/run installs it)"
    if os.geteuid() != 0:
        return "slurmd starts jobs as their owner and must run as root here"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    """`n` consecutive free TCP ports (slurmd's Port=[a-b] range wants them in a row)."""
    # each test worker starts from its own place, so two clusters starting at once do not race for a port
    for base in range(21000 + (os.getpid() % 400) * 17, 40000, 17):
        ok = True
        for port in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no free ports for Slurm")


class SlurmCluster:
    def __init__(self, root: Path, cred_expire: int = 10) -> None:
        self.root = Path(root)
        self.procs: list[subprocess.Popen] = []
        self.cred_expire = cred_expire
        self.env: dict[str, str] = {}
        self.slurmd: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = r / "munge" / "munge.socket"
        subprocess.run([_exe("munged"), f"--key-file={key}", f"--socket={sock}", f"--pid-file={r}/munge/munged.pid",
                        f"--log-file={r}/munge/munged.log", f"--seed-file={r}/munge/seed", "-f"],
                       check=True, capture_output=True, timeout=30)
        ports = _free_ports(2 + len(NODES))
        host = socket.gethostname()
        conf = r / "slurm.conf"
        conf.write_text(f"""ClusterName=tgtest
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=socket={sock},cred_expire={self.cred_expire}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=10
MinJobAge=600
NodeName=tgn[1-{len(NODES)}] NodeHostname={host} CPUs={os.cpu_count() or 2} RealMemory=1000 Port=[{ports[2]}-{ports[-1]}] State=UNKNOWN
PartitionName=debug Nodes=tgn[1-{len(NODES)}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        self.env = {"SLURM_CONF": str(conf)}
        env = {**os.environ, **self.env}
        self.procs.append(subprocess.Popen([_exe("slurmctld"), "-D", "-c", "-i"], env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for node in NODES:
            self.start_slurmd(node)
        deadline = time.time() + 60
        while time.time() < deadline:
            out = self.run("sinfo", "-h", "-o", "%T %D", check=False).stdout
            if "idle" in out and sum(int(x.split()[1]) for x in out.splitlines() if x.startswith("idle")) >= len(NODES):
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Slurm did not come up: sinfo said {out!r}; logs in {r}/log")

    def stop(self) -> None:
        if self.env:
            self.run("scancel", "--full", "-u", "root", check=False)
            deadline = time.time() + 20
            while time.time() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.5)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        self._kill_leftover_steps()
        pid = self.root / "munge" / "munged.pid"
        try:
            os.kill(int(pid.read_text().strip()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        self.procs.clear()

    def _kill_leftover_steps(self) -> None:
        """slurmstepd outlives a slurmd stopped under it; ours carry our SLURM_CONF in their environment."""
        mine = f"SLURM_CONF={self.env.get('SLURM_CONF')}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm", "rb") as f:
                    if f.read().strip() != b"slurmstepd":
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mine in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                continue

    def start_slurmd(self, node: str) -> None:
        proc = subprocess.Popen([_exe("slurmd"), "-D", "-N", node], env={**os.environ, **self.env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        self.slurmd[node] = proc

    def stop_slurmd(self, node: str) -> None:
        """A node that stops answering (its slurmd gone; its job steps' slurmstepd live on, as on a real node
        cut off from the controller)."""
        proc = self.slurmd.pop(node)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()

    # -- using it ---------------------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def sbatch(self, script: str, *options: str, env: dict[str, str] | None = None) -> str:
        path = self.root / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        out = subprocess.run(["sbatch", "--parsable", *options, str(path)], env={**os.environ, **self.env, **(env or {})},
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        from trainguard.watchdog.slurm import parse_scontrol

        return parse_scontrol(self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout)

    def wait(self, predicate, timeout: float, what: str, every: float = 0.5):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
