"""What a probe child's imports cost on this machine, and who pulls in the heavy optional packages.

    python3 benchmarks/diag/child_imports.py [--no-guard] llm [variant]   # prints the wall, the 25 costliest modules
                                                            # (self + children, -X importtime), and the import
                                                            # chain of scipy, sklearn, pandas, pyarrow if loaded

Runs the child's own import list (``workloads.preload``) in a fresh interpreter, as a standby child does
before it says ready (issue 60: 13-20 s on an H200 node, the first gap after a daemon start lost to it).
"""
import subprocess
import sys

CODE = r'''
import sys, time, traceback
WATCH = ("scipy", "sklearn", "pandas", "pyarrow", "matplotlib", "torchvision", "PIL", "numba", "cv2")
chains = {}
class Finder:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if name in WATCH and top not in chains:
            chains[top] = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                           if "importlib" not in f.filename][-6:]
        return None
sys.meta_path.insert(0, Finder())
t = time.perf_counter()
if GUARD:  # as the child's process entry does
    from gpuperfd.probe_child.import_guard import mark_unused_absent
    mark_unused_absent()
import gpuperfd.probe_child.child
from gpuperfd.probe_child import workloads
workloads.preload(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
print(f"WALL {time.perf_counter() - t:.2f} s, {len(sys.modules)} modules")
for top, chain in chains.items():
    if top in sys.modules:  # found and loaded (a find_spec alone is an availability check)
            print(f"CHAIN {top}: " + " <- ".join(reversed(chain)))
'''


def main() -> None:
    args = sys.argv[1:]
    guard = "--no-guard" not in args  # --no-guard: as children started before the import guard
    args = [a for a in args if a != "--no-guard"] or ["llm"]
    code = CODE.replace("if GUARD:", f"if {guard}:")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args], capture_output=True, text=True)
    print(done.stdout.strip())
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            self_us, cum_us, name = (part.strip() if i < 2 else part.rstrip()
                                     for i, part in enumerate(line[len("import time:"):].split("|")))
            name = name[1:]  # the space after the bar; what is left of the indent is the depth
            if self_us.isdigit():
                rows.append((int(cum_us), int(self_us), name))
    tops = [r for r in rows if not r[2].startswith(" ")]
    print("top-level imports by cumulative seconds:")
    for cum, own, name in sorted(tops, reverse=True)[:25]:
        print(f"  {cum / 1e6:6.2f} s (self {own / 1e6:5.2f}) {name}")
    heavy = {}
    for cum, own, name in rows:
        top = name.strip().split(".")[0]
        heavy[top] = heavy.get(top, 0) + own
    print("self seconds by top package:", ", ".join(f"{k} {v / 1e6:.2f}" for k, v in sorted(heavy.items(), key=lambda kv: -kv[1])[:15]))


if __name__ == "__main__":
    main()
