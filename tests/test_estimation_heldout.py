"""Held-out scoring of `bench estimate`: a fitted configuration is never scored, inconsistent
rows are neither fitted nor scored, splits are fixed, and each worst row gets a reason."""

from __future__ import annotations

import pytest
from apportion.experiments.bench import estimate_morphling as em
from apportion.experiments.bench import morphling_data as md
from apportion.experiments.bench.estimate import crius_splits


@pytest.fixture
def morphling_root(shared_data):
    return shared_data / "morphling"


@pytest.mark.parametrize("protocol", em.PROTOCOLS)
def test_no_protocol_scores_a_configuration_its_fit_saw(morphling_root, protocol):
    for fold in em.folds(protocol, morphling_root):
        seen = {em.config_key(s) for s in fold.fit}
        assert fold.scored and not seen & {em.config_key(r.sample) for r in fold.scored}
        assert all(r.inconsistent for r in fold.excluded)
        assert not any(r.sample in fold.fit for r in fold.excluded)
    assert em.folds(protocol, morphling_root)[0].fit == em.folds(protocol, morphling_root)[0].fit


@pytest.mark.parametrize("protocol,width", [("paper", 8), ("paper_cheapest", 2)])
def test_paper_protocol_is_the_tables_single_node_setting(morphling_root, protocol, width):
    added_any = False
    for fold in em.folds(protocol, morphling_root):
        assert all(r.family in em.DP_FAMILIES and len(r.sample.nodes) == 1
                   and r.sample.plan.gpus in em.PAPER_GPUS for r in fold.scored)
        prof = md.profile_samples(md.MODELS[fold.model], morphling_root)
        added = fold.fit[len(prof):]
        # the paper's rule: a ZeRO-DP run where the profile has none -- on the profile's
        # widest DP width (as GPT-2's profile holds it), or the cheapest one
        assert len(added) <= 1
        assert not added or not any(s.plan.zero_stage and not s.plan.offload for s in prof)
        for s in added:
            assert s.plan.zero_stage >= 1 and not s.plan.offload and s.plan.dp == width
            assert len(s.nodes) == 1
            added_any = True
        # the ZeRO-DP row it saw is not scored, the others are
        zero = {r.sample.plan.gpus for r in fold.scored if r.family == "ZeRO-DP+GA"}
        assert not {s.plan.gpus for s in added} & zero
    assert added_any


def test_covering_fit_sees_every_family_and_link_class(morphling_root):
    for fold in em.folds("covering", morphling_root):
        assert len(fold.fit) >= 7

        def key(s):
            return em.plan_family(s), em.placement_kind("".join(map(str, s.nodes or ())))

        seen = {key(s) for s in fold.fit}
        assert all(key(r.sample) in seen for r in fold.scored)


def test_inconsistent_rows_are_reported_apart(morphling_root):
    recs = md.trace_records(md.MODELS["roberta"], morphling_root)
    bad = [r for r in recs if r.inconsistent]
    assert {(r.code, r.placement) for r in bad} == {("ga", "1"), ("zero-dp", "1"),
                                                   ("zero-offload", "1")}
    assert all((f, s) not in md.trace_rows(md.MODELS["roberta"], morphling_root)
               for f, s in [(r.family, r.sample) for r in bad])


def test_worst_rows_say_where_their_error_lives():
    fold = em.Fold("vit", [], [], [])
    ctx = em.Context(fold)
    row = {"model": "vit", "family": "DP", "plan": "dp8-tp1-pp1", "placement": "17",
           "kind": "multi-node-odd", "gpus": 8, "measured_s": 0.42, "predicted_s": 0.08,
           "signed": -0.8,
           "error": 0.8, "parts_measured": {}, "parts_predicted": {}, "excluded": None}
    twin = {**row, "placement": "44", "kind": "multi-node", "measured_s": 0.066,
            "predicted_s": 0.08, "error": 0.2, "signed": 0.2}
    assert em.attribute({**row, "excluded": "halved batch"}, ctx, []) == "data: halved batch"
    assert em.attribute(row, ctx, [row, twin]).startswith("unseen placement kind")
    ctx.kinds = {"multi-node", "multi-node-odd"}
    assert em.attribute(row, ctx, [row, twin]).startswith("topology: 17")
    tp = {**row, "plan": "dp1-tp4-pp1", "placement": "4", "kind": "single-node"}
    assert "TP collectives" in em.attribute(tp, ctx, [tp])
    tables = em.error_tables([row, twin])
    assert {t["kind"] for t in tables["family_kind"]} == {"multi-node", "multi-node-odd"}


def test_crius_splits_are_fixed_and_hold_models_out_whole():
    class Row:
        def __init__(self, job: str) -> None:
            self.job = job

    rows = [Row(f"{m}_{b}") for m in ("bert_1.3B", "bert_2.6B", "moe_1.3B", "moe_2.4B",
                                      "wide_resnet_1B", "wide_resnet_2B") for b in (128, 256)]
    splits = crius_splits(rows)
    assert splits == crius_splits(list(reversed(rows)))
    (train, test), = splits["half"]
    assert train | test == {r.job for r in rows} and not train & test
    held = [t for _, t in splits["kfold"]]
    assert sorted(j for t in held for j in t) == sorted(r.job for r in rows)
    for train, test in splits["kfold"]:
        assert not {j.rsplit("_", 1)[0] for j in train} & {j.rsplit("_", 1)[0] for j in test}
