"""``hack/local-node``: the command line."""

from __future__ import annotations

import importlib
import sys

from devtools.localnode.common import NODE_NAME, NodeError, log, node_dir
from devtools.localnode.lifecycle import (
    check_prerequisites,
    down,
    leftovers,
    node_names,
    remove_mountpoints,
    restart_kubelet,
    status,
    up,
)
from devtools.localnode.processes import import_images


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(importlib.import_module("devtools.localnode").__doc__, file=sys.stderr)
        return 0 if len(argv) >= 2 else 2
    cmd, names = argv[1], argv[2:]
    try:
        if cmd == "up" and names:
            for name in names:
                if not NODE_NAME.fullmatch(name):
                    raise NodeError(
                        f"node name {name!r} is not a lower-case DNS label (a-z, 0-9, '-', at "
                        "most 63 characters, starting and ending with a letter or digit)"
                    )
            check_prerequisites()
            for name in names:
                up(name)
        elif cmd == "down":
            left = [x for name in (names or node_names()) for x in down(name)]
            if not node_names():
                left += remove_mountpoints()
            return 1 if left else 0
        elif cmd == "restart-kubelet" and len(names) == 1:
            restart_kubelet(names[0])
        elif cmd == "images" and len(names) == 1:
            log(f"{names[0]}: imported {', '.join(import_images(node_dir(names[0]))) or 'nothing'}")
        elif cmd == "status":
            return status()
        elif cmd == "leftovers":
            found = leftovers()
            print("\n".join(found) or "nothing left")
            return 1 if found else 0
        else:
            print(importlib.import_module("devtools.localnode").__doc__, file=sys.stderr)
            return 2
    except NodeError as e:
        log(f"ERROR: {e}")
        return 1
    return 0
