# Sourced by the scale scripts: fake_router_spec PREFIX COUNT prints the
# 2014 Neutron fake-router fleet (docs/BACKGROUND.md, report 000) as an
# nsfleet spec: COUNT namespaces PREFIXbar-{i}, ip_forward on, two veth
# pairs each with host ends PREFIXo{i} and PREFIXg{i}. The namespace
# entry is printed last, so that a caller may append more of its fields
# (processes:) and top-level sections (links:).
fake_router_spec() {
	cat <<EOF2
namespaces:
  - name: "${1}bar-{i}"
    count: $2
    sysctls:
      net.ipv4.ip_forward: "1"
    veths:
      - host: "${1}o{i}"
        peer: "qri-{i}"
      - host: "${1}g{i}"
        peer: "qgi-{i}"
EOF2
}
