"""The trust/sensitivity/risk model (risk.md) against values computed by hand from the seed's
worked example (SIRD states: n = 4; a histogram: m = 2)."""

from __future__ import annotations

import math

import pytest

from dp_core import InvalidQueryError, risk

N, M = 4, 2


def test_worked_example_by_hand():
    # sensitivity high (0.7), trust low (0.3): without noise q = 1, risk 0.7 * 0.7 = 0.49, "medium"
    assert risk.risk(risk.level_value("high"), risk.level_value("low"), 1.0) == pytest.approx(0.49)
    assert risk.level_name(0.49) == "medium"
    # a count of 100 with 10% noise at p = 0.9: A = 10, eps = ln(10) / 10 = 0.2303
    eps = risk.laplace_epsilon(10.0, 1.0, 0.9)
    assert eps == pytest.approx(math.log(10) / 10) and round(eps, 2) == 0.23
    # q = 1 / (1 + 3 exp(-2 * 0.2303)) = 1 / (1 + 3 * 0.6310) = 0.3456; risk = 0.49 * q = 0.169
    q = risk.guessing_bound(eps, N, M)
    assert q == pytest.approx(1 / (1 + 3 * math.exp(-2 * math.log(10) / 10)))
    assert q == pytest.approx(0.3456, abs=1e-4)
    assert risk.risk(0.7, 0.3, q) == pytest.approx(0.1694, abs=1e-4)
    assert risk.level_name(risk.risk(0.7, 0.3, q)) == "very low"
    assert risk.guessing_advantage(q, N) == pytest.approx((q - 0.25) / 0.75)


def test_chooser_reproduces_the_example_and_its_sentence():
    c = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=N, m=M)
    assert c.epsilon == pytest.approx(0.2303, abs=1e-4) and c.risk_level == "very low"
    assert c.epsilon <= c.epsilon_risk
    assert "between 90 and 110 with 90% probability" in c.summary
    acc = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.2, max_noise=10, n=N, m=M, prefer="accuracy")
    assert acc.epsilon == pytest.approx(c.epsilon_risk)
    assert risk.risk(0.7, 0.3, risk.guessing_bound(acc.epsilon, N, M)) == pytest.approx(0.2)


def test_epsilon_for_risk_closed_form_and_edges():
    e = risk.epsilon_for_risk(0.3, 0.7, 0.3, N, M)
    assert risk.risk(0.7, 0.3, risk.guessing_bound(e, N, M)) == pytest.approx(0.3)
    assert risk.epsilon_for_risk(0.7 * 0.7 / N, 0.7, 0.3, N) is None  # at the floor: impossible
    assert risk.epsilon_for_risk(0.49, 0.7, 0.3, N) == risk.EPSILON_CAP  # never exceeded: capped
    with pytest.raises(InvalidQueryError, match="even without any release"):
        risk.choose_epsilon(trust=0.3, sensitivity=0.7, max_risk=0.1, max_noise=10, n=N)
    with pytest.raises(InvalidQueryError, match="accept more noise or more risk"):
        risk.choose_epsilon(trust=0.3, sensitivity=0.7, max_risk=0.15, max_noise=1, n=N, m=M)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 2**-40), (3.0, 1e-3)])
def test_truncated_laplace_inverse_round_trips(eps, delta):
    bound = risk.truncated_laplace_bound(eps, 2.0, delta)
    assert bound == pytest.approx(2.0 / eps * math.log(1 + (math.exp(eps) - 1) / (2 * delta)))
    assert risk.truncated_laplace_epsilon(bound, 2.0, delta) == pytest.approx(eps, rel=1e-9)


def test_truncated_laplace_edges_and_per_output_delta():
    with pytest.raises(InvalidQueryError, match="at most the sensitivity"):
        risk.truncated_laplace_epsilon(1.0, 1.0, 1e-6)
    d = risk.per_output_delta(1e-6, 2)
    assert 1 - (1 - d) ** 2 == pytest.approx(1e-6)
    c = risk.choose_epsilon(trust="low", sensitivity="high", max_risk=0.3, max_noise=40, n=N, m=M, bounded_delta=1e-6)
    assert risk.truncated_laplace_bound(c.epsilon, 1.0, d) == pytest.approx(40, rel=1e-9)
    assert c.summary.endswith("always.")


def test_levels_map_to_numbers_and_back():
    assert [risk.level_value(x) for x in risk.LEVELS] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert [risk.level_name(x) for x in (0.0, 0.19, 0.2, 0.5, 0.79, 0.8, 1.0)] == [
        "very low", "very low", "low", "medium", "high", "very high", "very high"]
    with pytest.raises(InvalidQueryError):
        risk.level_value("extreme")


def test_relative_noise_uses_the_vector_norm():
    assert risk.relative_noise(10, [100.0]) == pytest.approx(0.1)
    assert risk.relative_noise(10, [100.0, 100.0]) == pytest.approx(0.1)  # sqrt(2)*10 / (sqrt(2)*100)
    assert risk.relative_noise(10, [100.0, 0.0]) == pytest.approx(math.sqrt(2) * 10 / 100)
