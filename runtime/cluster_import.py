"""``apportion cluster import``: a cluster YAML from what Slurm, Ray or Kubernetes reports.

Every source returns one dict per node, ``{"name", "gpu_type" (the engine's
raw GPU name), "gpus", "cpus", "memory_gib", ...extras}``
(``runtime.executors.slurm.importer``, ``runtime.executors.ray.importer``,
``runtime.executors.kubernetes.importer``); everything after that is written once, here:

* **GPU names** are mapped to catalog names (``apportion gpus --aliases``): the
  user's ``--gpu-map`` file first (YAML, raw name -> catalog name), then every
  name the catalog accepts (its aliases, GPU Feature Discovery's products, Slurm
  GRES types, Ray accelerator types), tried as given and normalised (lower case,
  no vendor prefix). A name several parts share (Ray's ``H100``: SXM, PCIe or
  NVL) is taken as the catalog says and a warning names the others and the
  ``--gpu-map`` line that settles it; an unmapped name is an
  :class:`~apportion.errors.InputError` naming it, a node that has it and the
  line to add to a ``--gpu-map`` file.
* **Grouping**: identical nodes (same GPU type and count, CPUs, memory and
  extras) form one node group that lists the real node names (``nodes:``),
  so decisions name nodes the engine knows. Extras and the raw GPU name are
  kept as the group's ``labels`` (``gpu_type_raw``, ``slurm_partitions``, ...),
  except ``gpu_product_label``, the node group's own field.
* **Writing**: the document is validated by the same loader ``--cluster``
  uses before anything is written, then written atomically (``-`` prints it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from apportion import outputs
from apportion.config import NODE_NAME, cluster_from_data, read_yaml
from apportion.console import printable
from apportion.runtime.executors.imported import Imported

from apportion.errors import CatalogError, InputError
from apportion.gpus import ambiguity, canonical_gpu_name, get_gpu, normalise_gpu_name

log = logging.getLogger(__name__)

SOURCES = ("slurm", "ray", "k8s")
CORE_KEYS = ("name", "gpu_type", "gpus", "cpus", "memory_gib", "mig_profile")

def normalise(raw: str) -> str:
    """The lookup key of a raw GPU name (:func:`apportion.gpus.normalise_gpu_name`)."""
    return normalise_gpu_name(raw)


def load_gpu_map(path: str | Path) -> dict[str, str]:
    """A ``--gpu-map`` file: a YAML mapping raw name -> catalog name (each checked)."""
    src = str(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(src, "(top level)", "expected a mapping of raw GPU names to catalog "
                         f"names (e.g. 'a100_80g: A100-80GB'), got {type(data).__name__}")
    out: dict[str, str] = {}
    for raw, name in data.items():
        field = printable(str(raw))[:80] or repr(raw)  # an empty key is named as ''
        if not isinstance(raw, (str, int)) or not isinstance(name, str) or not str(raw).strip():
            raise InputError(src, field, "raw GPU name and catalog name must both be text")
        try:
            out[normalise(str(raw))] = canonical_gpu_name(name)
        except CatalogError as exc:
            raise InputError(src, field, str(exc)) from None
    return out


class GpuNames:
    """Raw engine GPU names -> catalog names (the user's table, then the known ones)."""

    def __init__(self, user: Mapping[str, str] | None = None) -> None:
        self.user = {normalise(k): v for k, v in (user or {}).items()}

    def lookup(self, raw: str) -> str | None:
        key = normalise(raw)
        if key in self.user:
            return self.user[key]
        try:
            return canonical_gpu_name(str(raw).strip())
        except CatalogError:
            return None

    def ambiguous(self, raw: str) -> dict[str, object] | None:
        """The catalog's note on a name several parts share, unless the user mapped it."""
        return None if normalise(raw) in self.user else ambiguity(str(raw).strip())

    def catalog_name(self, raw: str, node: str, source: str) -> str:
        name = self.lookup(raw)
        if name is None:
            from apportion.gpus import gpu_catalog

            raise InputError(source, f"{node}.gpu_type", f"GPU type {raw!r} is not in the catalog "
                             f"and not mapped; add a line '{raw}: <catalog name>' to a YAML file "
                             f"and pass it with --gpu-map FILE (catalog: "
                             f"{', '.join(sorted(gpu_catalog()))})")
        return name


def _prefix(gpu_type: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", gpu_type.lower()).strip("-.") or "gpu"


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def group_nodes(nodes: Iterable[Mapping[str, Any]], names: GpuNames, source: str
                ) -> list[dict[str, Any]]:
    """Node groups (cluster YAML dicts) of identical nodes, real names kept, extras as labels."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    seen: set[str] = set()
    warned: set[str] = set()
    for i, n in enumerate(nodes):
        name = n.get("name")
        if not isinstance(name, str) or not name:
            raise InputError(source, f"nodes[{i}].name", "every node needs a name")
        if name in seen:
            raise InputError(source, f"{name}.name", "node name reported twice")
        if not re.fullmatch(NODE_NAME, name):
            raise InputError(source, f"{name}.name", "a node name apportion's cluster format "
                             "cannot hold (letters, digits, '_', '.', '-')")
        seen.add(name)
        gpus = n.get("gpus")
        if isinstance(gpus, float) and gpus.is_integer():
            gpus = int(gpus)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise InputError(source, f"{name}.gpus", f"not a GPU count: {gpus!r}")
        if gpus == 0:
            log.info("node %s has no GPUs: left out", name)
            continue
        raw = str(n.get("gpu_type") or "")
        if not raw:
            raise InputError(source, f"{name}.gpu_type", "node has GPUs but no GPU type; map "
                             "the engine's name for them with --gpu-map FILE")
        gpu_type = names.catalog_name(raw, name, source)
        note = names.ambiguous(raw)
        if note is not None and raw not in warned:
            warned.add(raw)
            log.warning("GPU type %r (node %s) is taken as %s, but %s; it may be %s: if so, "
                        "add '%s: <catalog name>' to a --gpu-map file", raw, name,
                        note["taken_as"], note["why"], " or ".join(note["also"]), raw)
        cpus, mem = _cpus_and_memory(n, name, source)
        labels = {"gpu_type_raw": raw}
        for k, v in sorted(n.items()):
            if k not in CORE_KEYS and v is not None:  # label keys are identifiers
                key_ = re.sub(r"[^A-Za-z0-9_]", "_", str(k)).lstrip("0123456789") or "label"
                labels[key_] = v if isinstance(v, str) else str(v)
        key = (gpu_type, gpus, cpus, mem, tuple(sorted(labels.items())))
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"gpu_type": gpu_type, "gpus_per_node": gpus, "cpus": cpus,
                               "mem": mem, "labels": labels, "nodes": []}
        g["nodes"].append(name)
    out: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for g in sorted(groups.values(), key=lambda g: (g["gpu_type"], _natural(min(g["nodes"],
                                                                                  key=_natural)))):
        base = _prefix(g["gpu_type"])
        used[base] = used.get(base, 0) + 1
        out.append(_group_entry(g, base if used[base] == 1 else f"{base}-g{used[base]}"))
    if not out:
        raise InputError(source, "nodes", "no node with GPUs was found; nothing to schedule on")
    return out


def _cpus_and_memory(n: Mapping[str, Any], name: str, source: str
                     ) -> tuple[int | None, float | None]:
    """A node's CPUs (a whole positive count) and host memory (GiB, to 3 decimals), each
    None when the engine did not report it; InputError naming the field otherwise."""
    cpus = n.get("cpus")
    if cpus is not None:
        if isinstance(cpus, float) and cpus.is_integer():
            cpus = int(cpus)
        if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus <= 0:
            raise InputError(source, f"{name}.cpus", f"not a positive CPU count: {cpus!r}")
    mem = n.get("memory_gib")
    if mem is not None:
        if not isinstance(mem, (int, float)) or isinstance(mem, bool) or not mem > 0:
            raise InputError(source, f"{name}.memory_gib", f"not a positive size: {mem!r}")
        mem = round(float(mem), 3)
    return cpus, mem


def _group_entry(g: dict[str, Any], prefix: str) -> dict[str, Any]:
    """One node group of the cluster YAML: its nodes in natural order, its GPUs, CPUs,
    memory and link, the product label as a field (manifests select nodes by it) and the
    other labels."""
    nodes_sorted = sorted(g["nodes"], key=_natural)
    d: dict[str, Any] = {"prefix": prefix,
                         "count": len(nodes_sorted), "nodes": nodes_sorted,
                         "gpu_type": g["gpu_type"], "gpus_per_node": g["gpus_per_node"]}
    if g["cpus"] is not None:
        d["cpus_per_node"] = g["cpus"]
    if g["mem"] is not None:
        d["host_memory_gib"] = g["mem"]
    d["intra_node_link"] = "nvlink" if get_gpu(g["gpu_type"]).link == "nvlink" else "pcie"
    labels = dict(g["labels"])
    product = labels.pop("gpu_product_label", None)
    if product:  # a first-class field: Kubernetes manifests select the group's nodes by it
        d["gpu_product_label"] = product
    d["labels"] = labels
    return d


def cluster_document(nodes: Iterable[Mapping[str, Any]], name: str, names: GpuNames,
                     source: str) -> dict[str, Any]:
    """The cluster YAML document, checked by the ``--cluster`` loader."""
    doc = {"name": name, "node_groups": group_nodes(nodes, names, source)}
    cluster_from_data(doc, f"{source} (imported)")  # raises InputError naming the field
    return doc


def write_document(doc: Mapping[str, Any], out: str | Path) -> None:
    """YAML to ``out`` by the output rules every command follows (:mod:`apportion.outputs`:
    ``-`` and ``/dev/stdout`` are stdout, a device or pipe is written in place, a file is
    replaced atomically with the umask's mode, a symlink to a file is followed and kept)."""
    text = yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=None, width=100)
    header = "# written by `apportion cluster import`; node names are the engine's own\n"
    outputs.write_text(out, header + text, "--out")


def check_output(out: str | Path) -> None:
    """``--out`` checked before anything is read (:func:`apportion.outputs.check_output`)."""
    outputs.check_output(out, "--out")


def _lazy(module: str, func: str, what: str) -> Callable[..., Any]:
    import importlib

    try:
        mod = importlib.import_module(f"apportion.runtime.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("apportion"):
            raise InputError("--from", "from", f"importing from {what} needs "
                             f"apportion.runtime.{module}, which this installation lacks") from None
        raise InputError("--from", "from", f"importing from {what} needs the {exc.name!r} "
                         "package") from None
    return getattr(mod, func)


def read_nodes(source: str, path: str | Path | None = None, ray_address: str | None = None,
               include_unavailable: bool = False, pods: str | Path | None = None,
               k8s_config: str | Path | None = None) -> Imported:
    """Nodes from one source, and what it left out and why: slurm (``scontrol``, or a
    saved ``scontrol show node`` / ``sinfo --json`` file), ray (a cluster address) or k8s
    (``kubectl get nodes -o json`` saved to a file; ``pods``: ``kubectl get pods -A -o
    json``, whose requests are taken off; ``k8s_config``: the settings whose
    ``tolerations`` say which tainted nodes the pods may use)."""
    if source == "slurm":
        from apportion.runtime.executors.slurm.importer import import_slurm

        text = None
        if path is not None:
            from apportion.config import read_text

            text = read_text(path, "scontrol output")
        return import_slurm(text, include_unavailable=include_unavailable,
                            source=str(path) if path is not None else None)
    if source == "ray":
        if not ray_address:
            raise InputError("--ray-address", "ray_address", "--from ray needs --ray-address "
                             "ADDR or RAY_ADDRESS (the head's address, e.g. 10.0.0.1:6379 or "
                             "auto)")
        return _lazy("executors.ray.importer", "import_ray", "Ray")(ray_address)
    if source == "k8s":
        if path is None:
            raise InputError("--from k8s", "NODES", "give the nodes as a file: "
                             "kubectl get nodes -o json > nodes.json")
        tolerations = None
        if k8s_config is not None:
            load = _lazy("executors.kubernetes.config", "load_k8s_config", "Kubernetes")
            tolerations = load(k8s_config).tolerations
        return _lazy("executors.kubernetes.importer", "import_k8s", "Kubernetes")(
            str(path), pods, tolerations)
    raise InputError("--from", "from", f"{source!r} is not one of {', '.join(SOURCES)}")


def mig_refused(imported: Imported, names: GpuNames) -> Imported:
    """``imported`` less the nodes whose GPUs are MIG slices no ``--gpu-map`` line maps
    (GPU Feature Discovery's ``<product>-MIG-<profile>``): a slice is not a GPU of the
    catalog, and such a node is left out by name rather than stopping the import."""
    kept = Imported(notes=list(imported.notes))
    for n in imported.nodes:
        raw = str(n.get("gpu_type") or "")
        if n.get("mig_profile") and normalise(raw) not in names.user:
            kept.leave_out(str(n.get("name")), f"MIG slices {raw} x{n.get('gpus')}: apportion "
                           "places whole GPUs; to schedule a slice as a GPU add "
                           f"'{raw}: <catalog name>' to a --gpu-map file, or turn MIG off")
            kept.notes = [x for x in kept.notes if x.left_out or x.node != n.get("name")]
            continue
        kept.nodes.append(n)
    return kept


def import_cluster(source: str, out: str | Path, path: str | Path | None = None,
                   ray_address: str | None = None, gpu_map: str | Path | None = None,
                   name: str | None = None, include_unavailable: bool = False,
                   pods: str | Path | None = None, k8s_config: str | Path | None = None
                   ) -> tuple[dict[str, Any], Imported]:
    """Read, map, group, validate, write; returns the document written and what was read
    (its notes say which nodes were left out or cut down, and why)."""
    check_output(out)
    if pods is not None and source != "k8s":
        raise InputError("--pods", "pods", "running pods are read for --from k8s only")
    names = GpuNames(load_gpu_map(gpu_map) if gpu_map is not None else None)
    imported = mig_refused(read_nodes(source, path, ray_address, include_unavailable, pods,
                                      k8s_config), names)
    label = {"slurm": "scontrol show node", "ray": f"ray {ray_address}",
             "k8s": str(path)}.get(source, source)
    if source == "slurm" and path is not None:
        label = str(path)
    doc = cluster_document(imported.nodes, name or f"{source}-cluster", names, label)
    write_document(doc, out)
    return doc, imported
