# Builds one topology with Mininet's Python API, for nsfleet's topology
# scenario (bench/topology.go), and reports each phase's time as JSON lines
# on stdout. Reads {"hosts": [...], "switches": [...], "links": [[a, b]...]}
# on stdin. Switches are Linux bridges in the host namespace with spanning
# tree on (the fat-tree has loops; nothing is sent, but IPv6 neighbour
# discovery would circle them), no controller, no traffic shaping.
#
# Mininet's own start-up (Mininet.init) raises host-wide sysctls; this run
# must not change the host, so it is skipped and only this process's
# limits are raised. Nothing here cleans up with `mn -c` (it removes
# interfaces and kills processes by pattern, not only this run's): the
# caller removes what this run leaves, by its own unique prefix.
import json
import resource
import sys
import time

from mininet.net import Mininet
from mininet.nodelib import LinuxBridge
from mininet.topo import Topo


def say(**kw):
    print(json.dumps(kw), flush=True)


def main():
    want = json.load(sys.stdin)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    Mininet.inited = True  # skip fixLimits: no host-wide sysctl changes

    topo = Topo()
    for h in want["hosts"]:
        topo.addHost(h)
    for s in want["switches"]:
        topo.addSwitch(s, stp=True)
    for a, b in want["links"]:
        topo.addLink(a, b)

    net = Mininet(topo=topo, switch=LinuxBridge, controller=None,
                  build=False, autoSetMacs=False)
    total = len(want["hosts"]) + len(want["switches"])
    made = {"nodes": 0, "links": 0}
    every = max(1, (total + len(want["links"])) // 20)

    def counted(fn, key):
        def wrapped(*args, **kw):
            r = fn(*args, **kw)
            made[key] += 1
            if (made["nodes"] + made["links"]) % every == 0:
                say(event="progress", nodes=made["nodes"], links=made["links"])
            return r
        return wrapped

    net.addHost = counted(net.addHost, "nodes")
    net.addSwitch = counted(net.addSwitch, "nodes")
    net.addLink = counted(net.addLink, "links")

    t = time.monotonic()
    net.build()
    say(event="built", s=time.monotonic() - t, nodes=made["nodes"], links=made["links"])
    t = time.monotonic()
    net.start()
    say(event="started", s=time.monotonic() - t)
    t = time.monotonic()
    net.stop()
    say(event="stopped", s=time.monotonic() - t)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # report where it failed, then fail
        say(event="error", error="%s: %s" % (type(e).__name__, e))
        sys.exit(1)
