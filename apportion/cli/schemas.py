"""Every file apportion reads or writes, by name, as JSON Schema (``apportion schema``).

Inputs are the strict pydantic models their loaders validate with (unknown fields refused,
``additionalProperties: false``); outputs are the open models of :mod:`apportion.formats`
(every field named is always written; fields are only ever added). YAML inputs are
described as the JSON they parse to. CSV files (``--tables``, ``--jobs-csv``, compare's
``summary.csv``) and the HTTP API (its own ``/openapi.json``) are not listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from apportion import formats
from apportion.config import ClusterSpec, JobEntry, JobsLinesHeader, JobsSpec, TenantsSpec
from apportion.decision_file import DecisionFile
from apportion.finetune_spec import _TaskFile
from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.shards_spec import UnitsFile

DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class FileFormat:
    name: str
    kind: str  # input | output
    doors: str  # the commands (and flags) that read or write it
    model: type[BaseModel] | None = None
    schema: dict[str, Any] | None = None  # a format no model describes

    def json_schema(self) -> dict[str, Any]:
        body = (self.model.model_json_schema() if self.model is not None
                else dict(self.schema or {}))
        about = body.pop("description", "")
        body.pop("title", None)
        return {"$schema": DIALECT, "title": f"apportion {self.name}",
                "description": f"{self.kind}: {self.doors}." + (f" {about}" if about else ""),
                **body}


GPU_MAP = {"type": "object", "description": "raw GPU name (Slurm GRES type, Ray accelerator "
           "type, GPU Feature Discovery product) -> catalog name (apportion gpus --aliases)",
           "additionalProperties": {"type": "string", "minLength": 1},
           "propertyNames": {"minLength": 1}}

FORMATS: tuple[FileFormat, ...] = (
    FileFormat("cluster", "input", "--cluster FILE.yaml of solve-round, run, serve, simulate, "
               "compare, export; written by cluster import", ClusterSpec),
    FileFormat("jobs", "input", "--jobs FILE.yaml of solve-round and export, submit FILE, "
               "POST /api/v1/jobs", JobsSpec),
    FileFormat("jobs-lines-header", "input", "the optional first line of a JSON-lines queue "
               "(--jobs FILE.jsonl of solve-round and export, submit FILE.jsonl)",
               JobsLinesHeader),
    FileFormat("jobs-line", "input", "every other line of a JSON-lines queue (--jobs "
               "FILE.jsonl of solve-round and export, submit FILE.jsonl): one job, the fields "
               "of a jobs YAML entry", JobEntry),
    FileFormat("tenants", "input", "--tenants FILE.yaml of solve-round, run, serve, simulate, "
               "compare and export kueue", TenantsSpec),
    FileFormat("k8s-config", "input", "--k8s-config FILE.yaml of run, serve and export",
               K8sConfig),
    FileFormat("gpu-map", "input", "cluster import --gpu-map FILE.yaml", schema=GPU_MAP),
    FileFormat("units", "input", "solve-shards --units FILE.json", UnitsFile),
    FileFormat("finetune-tasks", "input", "solve-finetune --tasks FILE.yaml", _TaskFile),
    FileFormat("export-decision", "input", "export k8s and export slurm --decision FILE.json "
               "(what they read of solve-round's decision; other keys are ignored)",
               DecisionFile),
    FileFormat("decision", "output", "solve-round --json", formats.DecisionOut),
    FileFormat("problem", "output", "solve-round --dump-problem", formats.ProblemOut),
    FileFormat("simulate-summary", "output", "simulate --json, and compare's "
               "<policy>-s<seed>/summary.json", formats.SimulateSummary),
    FileFormat("status", "output", "status --json", formats.StatusOut),
    FileFormat("history", "output", "history --json", formats.HistoryOut),
    FileFormat("export-k8s-index", "output", "export k8s: DIR/index.json", formats.K8sIndex),
    FileFormat("export-slurm-index", "output", "export slurm: DIR/index.json",
               formats.SlurmIndex),
    FileFormat("compare-plots", "output", "compare: RUN/plots.json", formats.ComparePlots),
)
BY_NAME = {f.name: f for f in FORMATS}


def all_schemas() -> dict[str, Any]:
    """One document: every format's schema by name."""
    return {"$schema": DIALECT, "title": "apportion's file formats",
            "description": "inputs (strict: unknown fields refused) and outputs (keys are a "
                           "contract; fields are only ever added); `apportion schema NAME` "
                           "prints one",
            "inputs": {f.name: f.json_schema() for f in FORMATS if f.kind == "input"},
            "outputs": {f.name: f.json_schema() for f in FORMATS if f.kind == "output"}}
