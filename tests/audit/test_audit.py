"""The empirical DP audit in CI: every real path passes, every broken variant is caught.

Each audit runs the real release RUNS times on each of two neighbouring datasets (1e5 releases per
mechanism), searches an event on the first half and bounds epsilon from below on the second half
(Clopper-Pearson; harness.py). A sound mechanism fails only if the lower bound at confidence
1 - 1e-7 exceeds its claimed epsilon, i.e. with probability below 1e-7. The broken variants are
injected here only (monkeypatch), never in the product, and must be caught by the same audit at
the same sample size. Long runs: bench/audit.py; results in docs/privacy.md.
"""

from __future__ import annotations

from dataclasses import replace

import cases
import harness
import numpy as np
import pytest

import dp_core.aggregates as aggregates_module
import dp_core.bounds as bounds_module
import dp_core.engine as engine_module
import dp_core.partition_selection as selection_module
import dp_core.release as release_module
import dp_core.selection_damped as damped_module
import dp_core.selection_weighted as weighted_module

RUNS = 50_000  # per neighbour: 1e5 releases per mechanism, half to search events, half to test

SOUND = list(cases.cases())


@pytest.mark.parametrize("name", SOUND)
def test_real_path_passes_the_audit(name):
    result = cases.audit(cases.cases()[name], RUNS)
    print(result.line())
    assert not result.violated, result.line()


def no_clamping(monkeypatch):
    """Per-unit values are not clamped to [L, U] (the noise still assumes they are)."""
    monkeypatch.setattr(aggregates_module, "_clamp_sql", lambda expr, lower, upper: expr)


def noise_halved(monkeypatch):
    """The Laplace noise has half its computed scale."""
    real = release_module.discrete_laplace
    monkeypatch.setattr(release_module, "discrete_laplace", lambda scale, n: real(scale / 2, n))


def gaussian_noise_quartered(monkeypatch):
    """The Gaussian noise has a quarter of its computed sigma (a variance / sigma mix-up of that
    size). Halving it (true epsilon 4.2 at delta 1e-5 for the claimed 2) is not caught at 1e5
    runs: a Gaussian's claim at delta 1e-5 rests on events rarer than the sample can see (lower
    bound 1.3 measured); bench/audit.py at 1e6+ runs is the place for that."""
    real = release_module.discrete_gaussian

    def quartered(sigma, n, *, variance=None):
        return real(sigma / 4, n, variance=None if variance is None else variance / 16)

    monkeypatch.setattr(release_module, "discrete_gaussian", quartered)


def weighted_threshold_too_low(monkeypatch):
    """The weighted Gaussian selection keeps partitions whose noisy weight is >= one unit's."""
    monkeypatch.setattr(weighted_module, "gaussian_threshold", lambda sigma, delta, cu: weighted_module.WEIGHT_ONE)


def damped_threshold_too_low(monkeypatch):
    """Damped MAD keeps partitions whose noisy weight is >= one unit's, in both rounds."""
    monkeypatch.setattr(damped_module, "gaussian_threshold", lambda *args, **kwargs: weighted_module.WEIGHT_ONE)


def threshold_too_low(monkeypatch):
    """The Laplace-threshold selection keeps partitions whose noisy unit count is >= 1."""
    monkeypatch.setattr(selection_module, "discrete_laplace_threshold", lambda epsilon, delta, cu: 1)


def bound_ignored(monkeypatch):
    """The bounding SQL keeps all of a unit's partitions (the noise still assumes C_u)."""
    real = engine_module.build_plan
    monkeypatch.setattr(engine_module, "build_plan",
                        lambda query, *a, **k: real(replace(query, max_partitions_contributed=1000), *a, **k))


def bounds_without_noise(monkeypatch):
    """APPROX_BOUNDS reads the exact histogram: its 'noisy' counts are the exact ones."""
    real = bounds_module.add_noise

    def exact_counts(exact, **kwargs):
        out = real(exact, **kwargs)
        return replace(out, values=np.asarray(exact, dtype=np.float64))

    monkeypatch.setattr(bounds_module, "add_noise", exact_counts)


def bounds_noise_unused(monkeypatch):
    """Issue 19's defect: the noise is drawn and published, but the bins are chosen from the
    exact histogram."""
    real = bounds_module.infer_bounds

    def broken(counts, **kwargs):
        out = real(counts, **kwargs)
        layout = bounds_module.bin_layout(kwargs["integer"], kwargs["signed"])
        exact = np.array([counts.get((neg, e), 0) for neg, e, _, _ in layout])
        above = np.flatnonzero(exact > out.threshold)
        if above.size == 0:
            return out
        upper = layout[above[-1]][3] - (1.0 if kwargs["integer"] else 0.0)
        return replace(out, upper=upper if out.upper is not None else None)

    monkeypatch.setattr(bounds_module, "infer_bounds", broken)


BROKEN = {
    "no clamping": (no_clamping, "SUM, public partitions"),
    "noise scale halved": (noise_halved, "SUM, no GROUP BY"),
    "selection threshold too low": (threshold_too_low, "COUNT(DISTINCT unit), Laplace threshold (reused count)"),
    "Gaussian noise sigma quartered": (gaussian_noise_quartered, "COUNT + SUM, Gaussian (pooled)"),
    "weighted Gaussian selection threshold too low": (weighted_threshold_too_low, "COUNT, weighted Gaussian selection"),
    "damped MAD selection threshold too low": (damped_threshold_too_low, "COUNT, damped MaxAdaptiveDegree selection"),
    "contribution bound ignored": (bound_ignored, "COUNT, C_u = 1, public partitions"),
    "APPROX_BOUNDS histogram without noise": (bounds_without_noise, "APPROX_BOUNDS, dataset"),
    "APPROX_BOUNDS noise drawn but bins from the exact histogram": (bounds_noise_unused, "APPROX_BOUNDS, dataset"),
}


@pytest.mark.parametrize("variant", list(BROKEN))
def test_broken_variant_is_caught(variant, monkeypatch):
    inject, case_name = BROKEN[variant]
    inject(monkeypatch)
    result = cases.audit(cases.cases()[case_name], RUNS)
    print(f"[{variant}] {result.line()}")
    assert result.violated, f"{variant} was not caught: {result.line()}"


def test_approx_bounds_bins_follow_the_noisy_counts(monkeypatch):
    """Issue 19's defect class, as behaviour: with a noisy histogram that disagrees with the exact
    one, the bounds are read off the noisy counts (and the published counts are those)."""
    from dp_core.accounting import Share

    layout = bounds_module.bin_layout(True, False)
    share = Share("bounds", 1.0)
    k = bounds_module.discrete_threshold(1.0, 1, len(layout), 1e-9)
    exact = {(False, 3): 10 * k, (False, 10): 10 * k}  # exact: bins 3 and 10 stand out
    noisy = np.zeros(len(layout))
    noisy[[2, 6]] = k + 1  # noisy: bins 2 and 6 do, 3 and 10 do not
    real = bounds_module.add_noise
    monkeypatch.setattr(bounds_module, "add_noise",
                        lambda values, **kw: replace(real(values, **kw), values=noisy.copy()))
    got = bounds_module.infer_bounds(exact, label="x", integer=True, signed=False, share=share, max_partitions=1,
                                     failure=1e-9, need_lower=True, need_upper=True)
    assert (got.lower, got.upper) == (layout[2][2], layout[6][3] - 1)
    assert list(got.noisy_counts) == list(noisy)


@pytest.mark.parametrize("name", ["COUNT, MaxAdaptiveDegree selection", "COUNT, damped MaxAdaptiveDegree selection"])
def test_the_audit_s_round_two_weights_are_the_product_statement_s_for_each_outcome(name):
    """The audit's round-2 weights (harness.round_two_weights: each outcome's rows read back as
    tuples and matched to the partitions by key) are those of the product's `round_two_sql` run
    through the engine's backend and merged on the keys, on both neighbours, for round-1 outcomes
    drawn as the audit draws them (nothing released, and every partition released, among them)."""
    from dp_core import selection_damped, selection_mad
    from dp_core.accounting import plan_budget
    from dp_core.backend import DuckDBBackend

    case = cases.cases()[name]
    query = case.query
    share, cu = plan_budget(query).selection_share, query.effective_max_partitions
    keys = list(query.group_by)
    for data in case.data():
        backend = DuckDBBackend.for_input(data, threads=1)
        close, backend.close = backend.close, lambda: None  # kept open for round 2's SQL, as the harness does
        try:
            stats = engine_module.exact_statistics(query, backend, bounding_seed=harness.SEED,
                                                   budget=plan_budget(query))
            base = stats.rows.drop(columns=["_mad_r1", "_w2"])
            with_clause = harness.bounded_with_clause(backend, stats.plan, cu)
            released, damped = selection_damped.first_round(np.tile(base["_w1"].to_numpy(dtype=np.int64), 200),
                                                            query.selection, share, cu, query.epsilon)
            drawn = {(tuple(np.flatnonzero(r)), tuple(np.flatnonzero(d)))
                     for r, d in zip(released.reshape(200, -1), damped.reshape(200, -1))}
            every = tuple(range(len(base)))
            outcomes = sorted(drawn | {((), ()), (every, ())})[:40]
            assert len(outcomes) > 5, outcomes
            batched = harness.round_two_weights(backend, query, base, with_clause, outcomes)
            for outcome, got in zip(outcomes, batched):
                chosen = [[tuple(row) for row in base.loc[list(rows), keys].itertuples(index=False)] for rows in outcome]
                if not any(chosen):
                    alone = base["_w1"].to_numpy(dtype=np.int64)
                else:
                    w2 = backend.run(selection_mad.round_two_sql(with_clause, query, chosen[0], backend.schema(),
                                                                 damped_keys=chosen[1]))
                    alone = base[keys].merge(w2, on=keys, how="left")["_w2"].fillna(0).to_numpy(dtype=np.int64)
                assert np.array_equal(got, alone), (outcome, got, alone)
        finally:
            close()
