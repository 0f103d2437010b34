"""Distributed-equivalent compilation: run one device's share of an N-device XLA program alone.

Crius times a stage's per-device computation by compiling the *partitioned*
program -- what each of the N devices really executes, with the shard shapes,
the padding and the re-layouts the SPMD partitioner chose -- and running it on
a single device with its collectives taken out. Re-writing the step by hand
with shard shapes (the ``sharded-shapes`` method of :mod:`profile_jax`) only
approximates that program; this module reproduces it.

The input is the optimised per-device HLO of a compiled N-device executable
(``compiled.as_text()``). :func:`rewrite_for_one_device` turns it into an
ordinary single-device module:

* every collective (all-reduce, all-gather, reduce-scatter, collective-permute,
  all-to-all, collective-broadcast; their ``-start``/``-done`` pairs and
  ``async-start`` wrappers; tuple-shaped combined forms) becomes a local op of
  the same result shape and dtype that still consumes its operand, so the work
  feeding it is neither dead-code eliminated nor re-ordered away:

  - all-reduce, collective-permute, all-to-all, collective-broadcast -> copy
    (tuple of operands for combined forms),
  - all-gather -> pad of the operand with zeros up to the gathered shape,
  - reduce-scatter -> slice of the operand's first block;

  for the sum all-reduce, all-gather and reduce-scatter, with device 0 at
  the head of each replica group, this is *exactly* device 0's value when
  every other device contributes zeros (a sum with zeros, a gather of zeros),
  which is what the equivalence tests exploit; a collective-permute or an
  all-to-all keeps the shape and the dependency, not the other devices' data;
* ``partition-id``/``replica-id`` become the constant 0 (device 0);
* the module header (``num_partitions``, ``replica_count``, the entry layout,
  the schedule flag), ``sharding=`` annotations, frontend attributes (Shardy
  shardings naming the mesh) and collective attributes (``channel_id``,
  ``replica_groups``) are dropped;
* the optimised module is turned back into logical HLO the compiler accepts as
  input: fusions become calls, a ``bitcast`` (whose meaning depends on the
  physical layouts) becomes the equivalent transpose/reshape/transpose, and
  layouts are stripped so XLA assigns them afresh.

:func:`compile_hlo_text` compiles the result for one device through the path
jaxlib 0.10 has for raw HLO (private modules, hence the profiler's fallback):
``jaxlib._hlo.hlo_module_from_text`` -> serialized ``HloModuleProto`` ->
``_jax.mlir.hlo_to_stablehlo`` -> ``Client.compile_and_load``.
XLA re-optimises the module (re-fuses it), so the timed program is the
per-device computation compiled from scratch for one device, not the very same
binary; FLOPs agree with the N-device program's per-device count.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
               "all-to-all", "collective-broadcast")
_UNSUPPORTED = ("send", "recv", "send-done", "recv-done", "ragged-all-to-all", "infeed",
                "outfeed")
_DEVICE_IDS = ("partition-id", "replica-id")
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\](?:\{([^}]*)\})?")
_INSTR = re.compile(r"^(\s*)(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_COMMENT = re.compile(r"/\*.*?\*/")


class HloRewriteError(RuntimeError):
    """The module holds something this rewriter cannot make local (send/recv, ...)."""


@dataclass
class Array:
    """One array shape of HLO text: dtype, logical dims and the layout's minor-to-major order."""

    dtype: str
    dims: list[int]
    minor_to_major: list[int] | None = None

    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass
class Instr:
    indent: str
    root: bool
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: list[str]

    def line(self, *, name: str | None = None, shape: str | None = None,
             opcode: str | None = None, operands: list[str] | None = None,
             attrs: list[str] | None = None, root: bool | None = None) -> str:
        ops = ", ".join(f"%{o}" for o in (self.operands if operands is None else operands))
        att = self.attrs if attrs is None else attrs
        tail = "".join(f", {a}" for a in att)
        r = self.root if root is None else root
        return (f"{self.indent}{'ROOT ' if r else ''}%{name or self.name} = {shape or self.shape} "
                f"{opcode or self.opcode}({ops}){tail}")

    def attr(self, key: str) -> str | None:
        for a in self.attrs:
            if a.startswith(key + "="):
                return a[len(key) + 1:]
        return None


@dataclass
class Rewritten:
    """A single-device module and what was replaced to get it."""

    text: str
    replaced: dict[str, int] = field(default_factory=dict)
    parameters: list[Array] = field(default_factory=list)


def _match_close(s: str, i: int) -> int:
    """Index of the bracket closing the one at ``s[i]``, skipping string literals."""
    depth, j, n = 0, i, len(s)
    while j < n:
        c = s[j]
        if c == '"':
            j += 1
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise HloRewriteError(f"unbalanced brackets in {s[:200]!r}")


def split_top(s: str) -> list[str]:
    """Split at the commas that are not inside brackets or strings."""
    out, depth, cur, quote = [], 0, [], False
    i = 0
    while i < len(s):
        c = s[i]
        if quote:
            cur.append(c)
            if c == "\\" and i + 1 < len(s):
                cur.append(s[i + 1])
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
            cur.append(c)
        elif c in "({[":
            depth += 1
            cur.append(c)
        elif c in ")}]":
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def parse_instr(line: str) -> Instr | None:
    """An instruction line of HLO text, or None for anything else (headers, braces)."""
    m = _INSTR.match(line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _match_close(rest, 0)
        shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
    else:
        sp = rest.find(" ")
        if sp < 0:
            return None
        shape, rest = rest[:sp], rest[sp + 1:].lstrip()
    p = rest.find("(")
    if p <= 0:
        return None
    opcode = rest[:p]
    end = _match_close(rest, p)
    inner = _COMMENT.sub("", rest[p + 1:end])
    operands = [o.split()[-1].lstrip("%") for o in split_top(inner)] if opcode != "constant" \
        else [rest[p + 1:end]]
    tail = rest[end + 1:].strip()
    attrs = split_top(tail[1:]) if tail.startswith(",") else []
    return Instr(m.group(1), bool(m.group(2)), m.group(3), shape, opcode, operands, attrs)


def parse_shape(shape: str) -> list[Array]:
    """The arrays of a shape (one for an array shape, the leaves in order for a tuple)."""
    out = []
    for dt, dims, layout in _ARRAY.findall(_COMMENT.sub("", shape)):
        m2m = [int(x) for x in layout.split(":")[0].split(",") if x.strip()] if layout else None
        out.append(Array(dt, [int(d) for d in dims.split(",") if d], m2m))
    return out


def _is_tuple(shape: str) -> bool:
    return shape.lstrip().startswith("(")


def _strip_layouts(text: str) -> str:
    return re.sub(r"(\[[0-9,]*\])\{[^}]*\}", r"\1", text)


def _drop_attr(line: str, key: str) -> str:
    """Remove ``, key=...`` (balanced braces) from a line."""
    while True:
        i = line.find(f", {key}=")
        if i < 0:
            return line
        j = i + len(key) + 3
        end = _match_close(line, j) + 1 if j < len(line) and line[j] in "{[(" else \
            (line.find(",", j) if line.find(",", j) >= 0 else len(line))
        line = line[:i] + line[end:]


def _drop_attrs(line: str, keys: tuple[str, ...]) -> str:
    for key in keys:
        line = _drop_attr(line, key)
    return line


def _bitcast_lines(ins: Instr, src: Array, dst: Array) -> list[str]:
    """A layout-changing bitcast as logical transpose -> reshape -> transpose.

    ``bitcast`` reinterprets the physical buffer: read the operand in its
    major-to-minor order, reshape to the result's physical dims, then transpose
    back to the result's logical order.
    """
    n_src, n_dst = len(src.dims), len(dst.dims)
    mts = list(reversed(src.minor_to_major)) if src.minor_to_major else list(range(n_src))
    mtd = list(reversed(dst.minor_to_major)) if dst.minor_to_major else list(range(n_dst))
    lines, cur = [], ins.operands[0]
    if mts != list(range(n_src)):
        t = Array(src.dtype, [src.dims[p] for p in mts])
        lines.append(ins.line(name=f"{ins.name}.__bt0", shape=t.text(), opcode="transpose",
                              operands=[cur], attrs=[f"dimensions={{{','.join(map(str, mts))}}}"],
                              root=False))
        cur = f"{ins.name}.__bt0"
    phys = Array(dst.dtype, [dst.dims[p] for p in mtd])
    inv = [mtd.index(i) for i in range(n_dst)]
    last = inv == list(range(n_dst))
    lines.append(ins.line(name=ins.name if last else f"{ins.name}.__bt1", shape=phys.text(),
                          opcode="reshape", operands=[cur], attrs=[],
                          root=ins.root if last else False))
    if not last:
        lines.append(ins.line(shape=dst.text(), opcode="transpose", operands=[f"{ins.name}.__bt1"],
                              attrs=[f"dimensions={{{','.join(map(str, inv))}}}"]))
    return lines


def _forward(ins: Instr, shape: str, src: str) -> list[str]:
    """``ins.name`` as a same-shaped stand-in for ``src`` (copy, or a tuple of its leaves)."""
    if not _is_tuple(shape):
        return [ins.line(shape=shape, opcode="copy", operands=[src], attrs=[])]
    leaves = split_top(_COMMENT.sub("", shape.strip()[1:-1]))
    lines = [ins.line(name=f"{ins.name}.__g{i}", shape=leaf, opcode="get-tuple-element",
                      operands=[src], attrs=[f"index={i}"], root=False)
             for i, leaf in enumerate(leaves)]
    lines.append(ins.line(shape=shape, opcode="tuple",
                          operands=[f"{ins.name}.__g{i}" for i in range(len(leaves))], attrs=[]))
    return lines


def _dims_attr(ins: Instr) -> int:
    d = ins.attr("dimensions")
    if d is None:
        raise HloRewriteError(f"{ins.opcode} without dimensions: {ins.name}")
    return int(d.strip("{}").split(",")[0])


def _local_collective(ins: Instr, kind: str, shape: str, shapes: dict[str, str]) -> list[str]:
    """A local op of result ``shape`` standing in for collective ``kind`` on ``ins.operands``."""
    outs = parse_shape(shape)
    ops = ins.operands
    if kind in ("all-reduce", "collective-permute", "all-to-all", "collective-broadcast"):
        if kind == "collective-permute" and len(ops) > 1:
            ops = ops[:1]  # in-place form: (input, output buffer, offsets...)
        if len(ops) == 1 and not _is_tuple(shape):
            return [ins.line(shape=shape, opcode="copy", operands=ops, attrs=[])]
        if len(ops) == len(outs):
            return [ins.line(shape=shape, opcode="tuple", operands=ops, attrs=[])]
        raise HloRewriteError(f"{kind} {ins.name}: {len(ops)} operands for {len(outs)} results")
    if kind not in ("all-gather", "reduce-scatter"):
        raise HloRewriteError(f"no local stand-in for {kind}")
    _dims_attr(ins)  # pad/slice follow the shapes, which differ only on ``dimensions``
    lines, names = [], []
    ins_shapes = [parse_shape(shapes[o])[0] for o in ops]
    if len(ins_shapes) != len(outs):
        raise HloRewriteError(f"{kind} {ins.name}: {len(ops)} operands for {len(outs)} results")
    single = len(outs) == 1 and not _is_tuple(shape)
    for i, (op, src, dst) in enumerate(zip(ops, ins_shapes, outs)):
        nm = ins.name if single else f"{ins.name}.__c{i}"
        if kind == "all-gather":
            zero = f"{ins.name}.__zero{i}"
            lines.append(ins.line(name=zero, shape=f"{src.dtype}[]", opcode="constant",
                                  operands=[], attrs=[], root=False).replace("()", "(0)"))
            pad = "x".join(f"0_{b - a}" for a, b in zip(src.dims, dst.dims))
            lines.append(ins.line(name=nm, shape=dst.text(), opcode="pad", operands=[op, zero],
                                  attrs=[f"padding={pad}"], root=ins.root if single else False))
        else:
            sl = ", ".join(f"[0:{d}]" for d in dst.dims)
            lines.append(ins.line(name=nm, shape=dst.text(), opcode="slice", operands=[op],
                                  attrs=[f"slice={{{sl}}}"], root=ins.root if single else False))
        names.append(nm)
    if not single:
        lines.append(ins.line(shape=shape, opcode="tuple", operands=names, attrs=[]))
    return lines


def _collective_kind(opcode: str) -> str | None:
    base = opcode.removesuffix("-start")
    return base if base in COLLECTIVES else None


def rewrite_for_one_device(hlo_text: str) -> Rewritten:
    """The single-device, collective-free module of an SPMD-partitioned module's text."""
    lines = hlo_text.splitlines()
    parsed, instrs, comp_of, comp_root = _parse_module(lines)
    shapes = {n: i.shape for n, i in instrs.items()}
    done_shape = _async_done_shapes(instrs)

    def async_kind(ins: Instr) -> tuple[str | None, Instr | None]:
        called = (ins.attr("calls") or "").lstrip("%")
        inner = comp_root.get(called)
        if inner is None:
            return None, None
        return _collective_kind(inner.opcode), inner

    # computations an async-start wraps: rewritten too, counted once (at the async-start)
    wrapped = {(i.attr("calls") or "").lstrip("%") for i in instrs.values()
               if i.opcode == "async-start"}
    out: list[str] = []
    replaced: dict[str, int] = {}
    started: set[str] = set()
    for ln, ins in zip(lines, parsed):
        if ins is None:
            if ln.startswith("HloModule"):
                ln = "HloModule " + ln.split()[1].rstrip(",")
            out.append(ln)
            continue
        op = ins.opcode
        if op in _UNSUPPORTED:
            raise HloRewriteError(f"cannot make {op} local ({ins.name})")
        new: list[str] | None = None
        if op in _DEVICE_IDS:
            new = [ins.line(opcode="constant", operands=[], attrs=[]).replace("()", "(0)")]
        elif op == "fusion":
            keep = [a for a in ins.attrs if a.split("=")[0] in ("metadata",)]
            new = [ins.line(opcode="call", attrs=[f"to_apply={ins.attr('calls')}"] + keep)]
        elif op == "bitcast":
            src, dst = parse_shape(shapes[ins.operands[0]])[0], parse_shape(ins.shape)[0]
            new = _bitcast_lines(ins, src, dst)
        elif _collective_kind(op):
            kind = _collective_kind(op)
            assert kind is not None
            shape = done_shape.get(ins.name, ins.shape) if op.endswith("-start") else ins.shape
            new = _local_collective(ins, kind, shape, shapes)
            if op.endswith("-start"):
                started.add(ins.name)
            if comp_of[ins.name] not in wrapped:
                replaced[kind] = replaced.get(kind, 0) + 1
        elif op == "async-start":
            kind, inner = async_kind(ins)
            if kind is not None and inner is not None:
                proxy = Instr(ins.indent, ins.root, ins.name, ins.shape, inner.opcode,
                              ins.operands, inner.attrs)
                new = _local_collective(proxy, kind, done_shape.get(ins.name, inner.shape),
                                        shapes)
                started.add(ins.name)
                replaced[kind] = replaced.get(kind, 0) + 1
        elif (op.endswith("-done") or op == "async-update") and ins.operands \
                and _chain_start(ins, instrs) in started:
            new = _forward(ins, done_shape.get(_chain_start(ins, instrs), ins.shape),
                           ins.operands[0]) if op == "async-update" else \
                _forward(ins, ins.shape, ins.operands[0])
        if new is None:
            out.append(ln)
        else:
            out.extend(new)
    # shardings, and frontend attributes (Shardy's ``xla.sdy.sharding`` names a mesh the
    # one-device module lacks: the MLIR exporter aborts the process on it)
    text = "\n".join(_drop_attrs(x, ("sharding", "frontend_attributes", "control-predecessors"))
                     for x in out)
    text = _strip_layouts(text)
    entry = _entry_parameters(text)
    return Rewritten(text, replaced, entry)


def _parse_module(lines: list[str]) -> tuple[list[Instr | None], dict[str, Instr],
                                              dict[str, str], dict[str, Instr]]:
    """Each line's instruction (None for a computation's header and the like), the
    instructions by name, each one's computation, and each computation's root."""
    instrs: dict[str, Instr] = {}
    comp_of: dict[str, str] = {}  # instruction name -> computation name
    comp_root: dict[str, Instr] = {}
    comp = ""
    parsed: list[Instr | None] = []
    for ln in lines:
        ins = parse_instr(ln)
        parsed.append(ins)
        if ins is None:
            m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", ln)
            if m and not ln.startswith("HloModule"):
                comp = m.group(1)
            continue
        instrs[ins.name] = ins
        comp_of[ins.name] = comp
        if ins.root:
            comp_root[comp] = ins
    return parsed, instrs, comp_of, comp_root


def _async_done_shapes(instrs: dict[str, Instr]) -> dict[str, str]:
    """The final shape of each async chain (through its updates), keyed by its start."""
    done_shape: dict[str, str] = {}
    for ins in instrs.values():
        if ins.opcode.endswith("-done") and ins.operands:
            done_shape[_chain_start(ins, instrs)] = ins.shape
    return done_shape


def _chain_start(ins: Instr, instrs: dict[str, Instr]) -> str:
    start = ins.operands[0]
    while instrs.get(start) is not None and instrs[start].opcode == "async-update":
        start = instrs[start].operands[0]
    return start


def _entry_parameters(text: str) -> list[Array]:
    """The ENTRY computation's parameters in parameter-number order."""
    params: dict[int, Array] = {}
    in_entry = False
    for ln in text.splitlines():
        if ln.startswith("ENTRY"):
            in_entry = True
            continue
        if in_entry and ln.startswith("}"):
            break
        if in_entry:
            ins = parse_instr(ln)
            if ins is not None and ins.opcode == "parameter":
                if _is_tuple(ins.shape):
                    raise HloRewriteError("tupled entry parameters are not supported")
                params[int(ins.operands[0])] = parse_shape(ins.shape)[0]
    return [params[i] for i in sorted(params)]


# ---------------------------------------------------------------------------- compile and run

_NP_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
              "s32": "int32", "s64": "int64", "s8": "int8", "u8": "uint8", "u32": "uint32",
              "u64": "uint64", "pred": "bool"}


def compile_hlo_text(text: str, device: Any = None) -> Any:
    """Compile single-device HLO text (via StableHLO) for ``device``; a LoadedExecutable."""
    import jax
    from jax._src.lib import _jax
    from jax._src.lib import xla_client as xc
    from jaxlib import _hlo  # type: ignore[attr-defined]

    dev = device or jax.devices("cpu")[0]
    module = _hlo.hlo_module_from_text(text)
    mlir = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    opts = xc.CompileOptions()
    opts.num_replicas = 1
    opts.num_partitions = 1
    return dev.client.compile_and_load(mlir, xc.DeviceList((dev,)), opts)


def default_inputs(params: list[Array], fill: float = 0.01) -> list[Any]:
    """Inputs of the parameter shapes: floats at ``fill`` (no denormals), integers at 0."""
    import jax.numpy as jnp
    import numpy as np

    out = []
    for p in params:
        dt = jnp.dtype(_NP_DTYPES.get(p.dtype, "float32"))
        val = fill if jnp.issubdtype(dt, jnp.floating) else 0
        out.append(np.full(p.dims, val, dtype=dt))
    return out


def run(executable: Any, inputs: list[Any]) -> list[Any]:
    """Execute a single-device executable; its outputs as numpy arrays."""
    import jax
    import numpy as np

    dev = executable.local_devices()[0]
    bufs = [jax.device_put(x, dev) for x in inputs]
    res = executable.execute_sharded(bufs).disassemble_into_single_device_arrays()
    return [np.asarray(r[0]) for r in res]


def time_executable(executable: Any, inputs: list[Any], repeats: int = 3) -> float:
    """Median wall time of one execution after a warm-up, inputs already on the device."""
    import jax

    dev = executable.local_devices()[0]
    bufs = [jax.device_put(x, dev) for x in inputs]

    def once() -> float:
        t0 = time.perf_counter()
        res = executable.execute_sharded(bufs).disassemble_into_single_device_arrays()
        jax.block_until_ready([r[0] for r in res])
        return time.perf_counter() - t0

    once()
    return statistics.median(once() for _ in range(max(1, repeats)))


def flops(executable: Any) -> float:
    """FLOPs of a compiled executable from XLA's cost analysis."""
    cost = executable.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", 0.0))
