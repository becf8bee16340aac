"""The tier's nodes, one kind of node per module, with what they share beside them (as kind's
pkg/cluster/internal/providers/ lays out its node providers):

- kwok.py: nodes simulated by KWOK (tests/cluster/): Node objects shaped like the stacks' clusters,
  their pods started, ended or crash-looped by KWOK's stages;
- real.py: the real node (tests/e2e_node/): containerd, runc, the kubelet, kube-proxy, CoreDNS and
  kube-router, whose pods run;
- k3s.py: what k3d and k3s give a node, whichever kind plays it: its name and labels;
- images.py: the images the real node runs, built with buildah, and their manifest
  (.cache/control-plane/node-images.json), which the real node and the end-to-end tier's registry read.
"""
