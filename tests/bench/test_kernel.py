"""How the emulated cluster adapts to the kernel (benchmarks.kernel), with the kernel's
answers injected: the congestion control is ``cubic`` where a namespace may select it and the
namespace's default otherwise, and the report says which. No root needed (not marked bench:
these run in the unit session too)."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import kernel
from benchmarks.report import network_sentence


@pytest.mark.parametrize("preferred,current,allowed,want", [
    ("cubic", "bbr", ("reno", "bbr", "cubic"), "cubic"),  # allowed: select it
    ("cubic", "bbr", ("reno", "bbr"), None),  # available but not allowed: keep bbr
    ("cubic", "cubic", ("reno", "cubic"), None),  # already in use
    ("cubic", "bbr", None, "cubic"),  # policy unknown: try it
    ("cubic", None, ("reno", "cubic"), "cubic"),
    (None, "bbr", ("reno", "bbr", "cubic"), None),  # nothing asked for
    ("reno", "cubic", ("reno", "cubic"), "reno"),
])
def test_choose_congestion_control(preferred, current, allowed, want):
    assert kernel.choose_congestion_control(preferred, current, allowed) == want


class FakeNamespace:
    """Stands in for ``ip netns exec NS sh -c ...``: a namespace whose congestion control
    starts at ``current`` and may be set to what ``allowed`` lists (else the write fails
    with the kernel's EPERM, as ``echo`` reports it)."""

    def __init__(self, current: str, allowed: tuple[str, ...] | None):
        self.current, self.allowed, self.writes = current, allowed, []

    def read(self, netns):
        return self.current, self.allowed, ("reno", "bbr", "cubic")

    def run(self, argv, check=True):
        script = argv[-1]
        assert argv[:4] == ["ip", "netns", "exec", "ns0"] and kernel.CC_SYSCTL in script
        want = script.split()[1]
        self.writes.append(want)
        err = ""
        if self.allowed is None or want in self.allowed:
            self.current = want
        else:
            err = "sh: 1: echo: echo: I/O error"
        return subprocess.CompletedProcess(argv, 0, self.current + "\n", err)


@pytest.mark.parametrize("allowed,want,writes", [
    (("reno", "bbr", "cubic"), "cubic", ["cubic"]),
    (("reno", "bbr"), "bbr", []),  # this machine's policy: never even tries
])
def test_set_congestion_cubic_or_the_default(monkeypatch, allowed, want, writes):
    ns = FakeNamespace("bbr", allowed)
    monkeypatch.setattr(kernel, "read_congestion", ns.read)
    monkeypatch.setattr(kernel, "run_cmd", ns.run)
    assert kernel.set_congestion("ns0", "cubic") == want
    assert ns.writes == writes


def test_set_congestion_refused_despite_unknown_policy_keeps_the_default(monkeypatch):
    ns = FakeNamespace("bbr", None)
    ns.read = lambda netns: ("bbr", None, None)
    ns.allowed = ("reno", "bbr")  # what the kernel enforces, though nobody could read it
    monkeypatch.setattr(kernel, "read_congestion", ns.read)
    monkeypatch.setattr(kernel, "run_cmd", ns.run)
    assert kernel.set_congestion("ns0", "cubic") == "bbr"
    assert ns.writes == ["cubic"]


def test_report_says_which_congestion_control_and_qdisc():
    ok = {"shaper": "tbf", "congestion_control": "cubic", "congestion_control_requested": "cubic",
          "congestion_control_allowed": ["reno", "cubic"]}
    assert network_sentence([ok, ok]) == ("links shaped by `tbf`; TCP congestion control "
                                          "`cubic` on every host (Linux's default)")
    refused = dict(ok, shaper="htb", congestion_control="bbr",
                   congestion_control_allowed=["reno", "bbr"])
    text = network_sentence([refused])
    assert text.startswith("links shaped by `htb`; TCP congestion control `bbr` on every host")
    assert "does not let a network namespace select `cubic`" in text
    assert "`reno bbr`" in text
    # results saved before the record existed: what the cluster always used then
    assert "`tbf`" in network_sentence([None]) and "`cubic`" in network_sentence([None])


def test_unknown_qdisc_errors():
    assert kernel.unknown_qdisc("Error: Specified qdisc kind is unknown.")
    assert kernel.unknown_qdisc(RuntimeError("RTNETLINK answers: No such file or directory"))
    assert not kernel.unknown_qdisc("RTNETLINK answers: File exists")
