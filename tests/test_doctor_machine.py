"""``doctor``'s probes of what the engine depends on: cores vs --threads, memory vs --ram,
huge pages, the direct-read speed of the checkpoint's own disk, io_uring and O_DIRECT, memory
bandwidth, and the decode speed ``bench --predict``'s formula expects on this machine."""

import os
import sys

import pytest

import v4flash
from conftest import FIXTURES, main_
from v4flash import _core, doctor, limits

TINY = FIXTURES / "tiny-a"


def row(out: str, what: str) -> str:
    """The doctor line about ``what`` (status mark included)."""
    for line in out.splitlines():
        if line[5:].startswith(what + ":"):
            return line
    raise AssertionError(f"no {what!r} row in:\n{out}")


@pytest.fixture
def probes(monkeypatch):
    """Fixed probe results (and a record of what was probed)."""
    seen = {}

    def disk(path, nbytes, readers=1):
        seen.setdefault("disk_readers", []).append(readers)
        seen["disk"] = (path, nbytes)
        gbs, direct = seen.get("disk_result", (2.0, True))
        # the parallel probe reads slower here, so the row must keep the better figure
        return (gbs if readers == 1 else gbs / 2, direct)

    def mem(nbytes, threads):
        seen["mem"] = (nbytes, threads)
        return 40.0, "fake"

    monkeypatch.setattr(_core, "disk_read_gbs", disk)
    monkeypatch.setattr(limits, "mem_read_gbs", mem)
    return seen


def test_doctor_reports_every_probe(capsys):
    p = main_(capsys, "doctor", "-m", TINY)
    assert p.returncode == 0, p.stderr
    for what in ("kernels", "cores", "memory", "disk", "expert reads", "memory bandwidth"):
        row(p.stdout, what)
    row(p.stdout, "expected decode")
    if doctor.transparent_hugepages() is not None:
        row(p.stdout, "huge pages")


# --- cores vs --threads ---------------------------------------------------------------------


def test_threads_above_the_cores_get_a_warning(capsys):
    cores = doctor.usable_cores()
    p = main_(capsys, "doctor", "-m", TINY, "-t", 999)
    line = row(p.stdout, "cores")
    assert line.startswith("warn") and "--threads 999 is more than the" in line
    assert f"-t {cores}" in line
    assert row(main_(capsys, "doctor", "-m", TINY, "-t", cores).stdout, "cores").startswith("ok")
    assert doctor.thread_warning(None) is None and doctor.thread_warning(2, cores=2) is None
    assert "3 is more than the 2 cores" in doctor.thread_warning(3, cores=2)
    assert "the 1 core this" in doctor.thread_warning(2, cores=1)


def test_run_warns_about_too_many_threads(capsys):
    cores = doctor.usable_cores()
    args = ["run", "-m", TINY, "--temperature", "0", "-n", "2", "hi"]
    p = main_(capsys, *args, "-t", cores + 1)
    assert p.returncode == 0, p.stderr
    assert f"v4flash: warning: --threads {cores + 1} is more than the" in p.stderr
    assert "warning" not in main_(capsys, *args).stderr


def test_cgroup_quota_caps_the_cores(tmp_path, monkeypatch):
    root = tmp_path / "cg"
    (root / "a" / "b").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "a" / "cpu.max").write_text("150000 100000\n")
    (root / "a" / "b" / "cpu.max").write_text("300000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a/b\n")
    assert doctor._cgroup_cpu_quota(str(root), str(proc)) == 1.5
    proc.write_text("12:cpu:/x\n")  # cgroup v1 only: no quota read
    assert doctor._cgroup_cpu_quota(str(root), str(proc)) is None
    monkeypatch.setattr(doctor, "_cgroup_cpu_quota", lambda: 1.0)
    assert doctor.usable_cores() == 1
    monkeypatch.setattr(doctor, "_cgroup_cpu_quota", lambda: None)
    assert doctor.usable_cores() == len(os.sched_getaffinity(0))


# --- memory, huge pages ------------------------------------------------------------------------


def test_memory_is_what_the_planner_reads():
    # the core reads /proc/meminfo (its parser is tested in rust/plan.rs); the planner sizes
    # from the same available figure without --ram
    total, avail = doctor.memory_bytes()
    assert (total, avail) == _core.memory_info()
    if sys.platform.startswith("linux"):
        assert total and avail and 0 < avail <= total


def test_ram_above_what_is_available_gets_a_warning(capsys, monkeypatch, probes):
    monkeypatch.setattr(doctor, "memory_bytes", lambda: (32 * 10**9, 8 * 10**9))
    line = row(main_(capsys, "doctor", "-m", TINY, "--ram", 24).stdout, "memory")
    assert line.startswith("warn") and "8.0 GB available" in line
    assert "--ram 24 is more than is available" in line
    assert row(main_(capsys, "doctor", "-m", TINY, "--ram", 4).stdout, "memory").startswith("ok")


def test_huge_pages_mode(tmp_path, capsys, monkeypatch, probes):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert doctor.transparent_hugepages(str(f)) == "madvise"
    assert doctor.transparent_hugepages(str(tmp_path / "none")) is None
    monkeypatch.setattr(doctor.sys, "platform", "linux")
    monkeypatch.setattr(doctor, "transparent_hugepages", lambda: "never")
    line = row(main_(capsys, "doctor", "-m", TINY).stdout, "huge pages")
    assert line.startswith("warn") and "4 KiB pages" in line and "madvise" in line
    monkeypatch.setattr(doctor, "transparent_hugepages", lambda: "always")
    assert row(main_(capsys, "doctor", "-m", TINY).stdout, "huge pages").startswith("ok")


# --- the disk, io_uring, O_DIRECT ----------------------------------------------------------------


def test_disk_speed_is_measured_on_the_checkpoints_largest_shard(capsys, probes):
    ins = doctor.inspect_checkpoint(TINY, tokenizer=False)
    largest = max(ins.shard_sizes, key=ins.shard_sizes.get)
    line = row(main_(capsys, "doctor", "-m", TINY).stdout, "disk")
    assert probes["disk"] == (str(TINY / largest), doctor.DISK_PROBE_BYTES)
    assert line.startswith("ok") and "direct reads at 2.00 GB/s" in line and largest in line
    # measured one read at a time and with several in flight, both shown
    assert probes["disk_readers"] == [1, limits.DISK_READERS]
    assert "2.00 GB/s one at a time" in line
    assert f"1.00 GB/s {limits.DISK_READERS} in flight" in line
    probes["disk_result"] = (3.0, False)
    out = main_(capsys, "doctor", "-m", TINY).stdout
    line = row(out, "disk")
    assert line.startswith("warn") and "refuses O_DIRECT" in line
    assert "O_DIRECT: no" in row(out, "expert reads")


def test_filesystem_of_reads_the_mount_table(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n/dev/nvme0n1p1 /mnt/my\\040models xfs rw 0 0\n"
        "tmpfs /mnt/my\\040models/tmp tmpfs rw 0 0\n"
    )
    assert (
        doctor.filesystem_of("/mnt/my models/ck/x", str(mounts))
        == "/dev/nvme0n1p1 (xfs, mounted at /mnt/my models)"
    )
    assert doctor.filesystem_of("/etc", str(mounts)).startswith("/dev/sda1 (ext4")


def test_io_uring_probe(monkeypatch):
    # the core asks for the engine's own ring (its refusals' wording is tested in
    # rust/store/uring.rs); V4FLASH_IO_URING=0 turns it off as it does for the engine
    monkeypatch.delenv("V4FLASH_IO_URING", raising=False)
    ring, why = doctor.io_uring_status()
    if sys.platform.startswith("linux"):
        assert ring in (True, False) and (ring is True) == (why == "available"), (ring, why)
    else:
        assert ring is False and "Linux only" in why
    monkeypatch.setenv("V4FLASH_IO_URING", "0")
    assert doctor.io_uring_status() == (False, "turned off by V4FLASH_IO_URING=0")


def test_the_real_io_uring_probe_runs():
    ring, why = doctor.io_uring_status()
    assert ring in (True, False, None) and why


def test_expert_reads_row_names_the_engine(capsys, monkeypatch, probes):
    monkeypatch.setattr(doctor, "io_uring_status", lambda: (True, "available"))
    line = row(main_(capsys, "doctor", "-m", TINY).stdout, "expert reads")
    assert line.startswith("ok") and "will use io_uring, direct I/O" in line
    monkeypatch.setattr(doctor, "io_uring_status", lambda: (False, "refused by the system"))
    line = row(main_(capsys, "doctor", "-m", TINY).stdout, "expert reads")
    assert line.startswith("warn") and "refused" in line and "a pread pool, direct I/O" in line


# --- the speed to expect -----------------------------------------------------------------------


def test_expected_speed_is_bench_predicts_formula_at_this_ram(capsys, probes):
    p = main_(capsys, "doctor", "-m", TINY, "--ram", 24, "-t", 1)
    assert p.returncode == 0, p.stderr
    want = limits.predict_table(ram_gbs=[24], disk_gbss=[2.0], mem_gbs=40.0)[0]
    line = row(p.stdout, "expected decode")
    assert f"{want['limit_tok_s']:.2f} tok/s at most" in line and "--ram 24" in line
    assert f"{want['hit_rate']:.0%} hit rate" in line and "memory at 40.0 GB/s" in line
    assert probes["mem"] == (doctor.MEM_PROBE_BYTES, 1)  # on the threads asked for
    assert "40.0 GB/s" in row(p.stdout, "memory bandwidth")


def test_expected_speed_without_ram_uses_the_planners_room(capsys, probes):
    room = v4flash.plan(TINY)["available_bytes"] / 1e9
    line = row(main_(capsys, "doctor", "-m", TINY).stdout, "expected decode")
    want = limits.predict_table(ram_gbs=[room], disk_gbss=[2.0], mem_gbs=40.0)[0]
    assert f"{want['limit_tok_s']:.2f} tok/s" in line and f"{room:.1f} GB (no --ram" in line


def test_expected_speed_says_when_the_ram_is_too_small_for_the_full_model(capsys, probes):
    line = row(main_(capsys, "doctor", "-m", TINY, "--ram", 8).stdout, "expected decode")
    assert line.startswith("warn") and "leaves no expert cache" in line


def test_info_runs_no_probes(capsys, probes):
    p = main_(capsys, "info", "-m", TINY)
    assert p.returncode == 0 and "memory bandwidth" not in p.stdout
    assert "disk" not in probes and "mem" not in probes
