"""Host microseconds per statement of twell.torch.training's forward path before and after the C API call, one
synchronized step at a time (16384 rows, 0.5%; issue 15, bench/README.md v62's host breakdown): the module's
functions are re-made from their AST with a clock mark before each statement (nested blocks too), so the time
between two marks is the first statement's (each mark adds ~0.2-0.5 us). Statements under 0.8 us are left out.

  PYTHONPATH=python TWELL_LIB_DIR=build/lib .venv/bin/python bench/experiments/train_host_lines.py
"""
import ast, inspect, pathlib, statistics, sys, time, torch
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import torch_train_bench as b
from twell import runtime
from twell.torch import training

TARGETS = {"sparse_ffn_train", "_run_forward", "forward", "_entry", "trainable", "_sparse_train", "take_state"}
MARKS = []


class Mark(ast.NodeTransformer):
    def __init__(self):
        self.fn = []

    def visit_FunctionDef(self, node):
        self.fn.append(node.name)
        self.generic_visit(node)
        self.fn.pop()
        if node.name in TARGETS:
            node.body = self.marked(node.body, node.name)
        return node

    def marked(self, body, fn):
        out = []
        for st in body:
            for field in ("body", "orelse", "finalbody"):
                if isinstance(getattr(st, field, None), list) and getattr(st, field) and not isinstance(st, ast.FunctionDef):
                    setattr(st, field, self.marked(getattr(st, field), fn))
            mark = ast.parse(f"_M.append(({fn!r}, {st.lineno}, _ns()))").body[0]
            out += [mark, st]
        return out


src = inspect.getsource(training)
tree = Mark().visit(ast.parse(src))
ast.fix_missing_locations(tree)
training._M, training._ns = MARKS, time.perf_counter_ns
exec(compile(tree, training.__file__, "exec"), training.__dict__)
lines = src.splitlines()

orig = runtime.TrainingPlan.forward_struct
def fwd(self, *a, **k):
    MARKS.append(("C++ forward", 0, time.perf_counter_ns())); r = orig(self, *a, **k)
    MARKS.append(("after C++ forward", 0, time.perf_counter_ns())); return r
runtime.TrainingPlan.forward_struct = fwd

dev = torch.device("cuda")
M = 16384
leaves, dy = b.step_operands(b.uniform_layer(M, 0.005, dev), dev)
lam = torch.tensor(1e-3, device=dev)
per = {}
totals = []
for i in range(80):
    torch.cuda.synchronize()
    MARKS.clear()
    t0 = time.perf_counter_ns()
    y, l1 = training.sparse_ffn_train(*leaves, dispatch="sparse")
    t1 = time.perf_counter_ns()
    marks = [("call", -1, t0)] + list(MARKS) + [("return", -1, t1)]
    torch.autograd.backward([y, l1], [dy, lam])
    if i < 10:
        continue
    cpp = next(m[2] for m in marks if m[0] == "C++ forward")
    totals.append((cpp - t0, t1 - t0))
    seen = {}
    for (f, ln, t), (_, _, tn) in zip(marks, marks[1:]):
        k = (f, ln, seen.setdefault((f, ln), 0))
        seen[(f, ln)] += 1
        per.setdefault(k, []).append(tn - t)
    del y, l1
print(f"call -> C++ forward: {statistics.median([a for a, _ in totals]) / 1e3:.1f} us; whole forward call "
      f"{statistics.median([b_ for _, b_ in totals]) / 1e3:.1f} us (medians of {len(totals)} steps)")
print("median us  statement (the time until the next mark)")
for k in per:
    us = statistics.median(per[k]) / 1e3
    if us >= 0.8:
        f, ln, n = k
        text = lines[ln - 1].strip()[:90] if ln > 0 else ""
        print(f"{us:8.1f}  {f}:{ln}{'#' + str(n) if n else ''}  {text}")
