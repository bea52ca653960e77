"""openclawrl_loss against values worked out by hand (ARCHITECTURE.md §4).

Notation in the comments: ρ ratio, A reward, d clipped teacher-minus-old difference, w softmax
weight of ℓold over S_t. Clip range with the defaults: [0.8, 1.28].
"""

import math

import pytest
import torch

from recipes.openclawrl.objective import LOGPROB_FLOOR, ObjectiveConfig, objective_from_options, openclawrl_loss
from reef_shim.errors import ShimError

LN = math.log
# w over S_t = {10, 20} with ℓold = (ln .6, ln .2) is (.75, .25).
OLD2 = [LN(0.6), LN(0.2)]


def Engine(**kw):  # noqa: N802
    """The config with ℓold = the engine's recorded logprobs, which the hand values below are
    worked out for (ρ ≠ 1 before any update); `trainer` mode has its own tests."""
    return ObjectiveConfig(old_logprobs="engine", **kw)


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def batch(logp_new, logp_old, mask, reward, topk_ids, topk_old, topk_new, teacher_logp, teacher_ids, cand_mask):
    """Tensors from nested lists; H = 0 allowed by passing [] per sample for the teacher lists."""
    B, T = len(logp_new), len(logp_new[0])
    K = len(topk_ids[0][0])
    H = len(cand_mask[0])
    return {
        "logp_new": t(logp_new).requires_grad_(),
        "logp_old": t(logp_old),
        "mask": t(mask),
        "reward": t(reward),
        "topk_ids": torch.tensor(topk_ids, dtype=torch.long),
        "topk_logp_old": t(topk_old),
        "topk_logp_new": t(topk_new).requires_grad_(),
        "teacher_topk_logp": t(teacher_logp).reshape(B, H, T, K),
        "teacher_top_ids": torch.tensor(teacher_ids, dtype=torch.long).reshape(B, H, T, K),
        "cand_mask": torch.tensor(cand_mask, dtype=torch.bool).reshape(B, H),
    }


def rl_batch(logp_new, logp_old, mask, reward):
    """One sample, no teacher candidate: only the RL term is live."""
    T = len(logp_new)
    ids = [[[10, 20]] * T]
    old = [[OLD2] * T]
    return batch([logp_new], [logp_old], [mask], [reward], ids, old, old, [[[OLD2] * T]], [[[[10, 20]] * T]], [[False]])


# --- RL ------------------------------------------------------------------------------------------

def test_rl_positive_reward_clips_high_ratio_only():
    # ρ = (1.5, 0.5), A = +1: token 0 min(1.5, 1.28) = 1.28 (clipped), token 1 min(0.5, 0.8) = 0.5.
    b = rl_batch([-1 + LN(1.5), -2 + LN(0.5)], [-1, -2], [1, 1], 1.0)
    loss, m = openclawrl_loss(b, Engine())
    assert loss.item() == pytest.approx(-(1.28 + 0.5) / 2)
    assert m["rl_loss"] == pytest.approx(-0.89) and m["opd_loss"] == 0.0
    assert m["rl_clip_frac"] == 0.5 and m["tokens"] == 2 and m["samples_with_teacher"] == 0
    loss.backward()
    # Clipped token has no gradient; the other gets -ρ·A / 2.
    assert b["logp_new"].grad.tolist()[0] == pytest.approx([0.0, -0.25])


def test_rl_negative_reward_clips_low_ratio_only():
    # ρ = (1.5, 0.5), A = -1: token 0 min(-1.5, -1.28) = -1.5, token 1 min(-0.5, -0.8) = -0.8 (clipped).
    b = rl_batch([-1 + LN(1.5), -2 + LN(0.5)], [-1, -2], [1, 1], -1.0)
    loss, m = openclawrl_loss(b, Engine())
    assert loss.item() == pytest.approx(1.15)
    assert m["rl_clip_frac"] == 0.5
    loss.backward()
    assert b["logp_new"].grad.tolist()[0] == pytest.approx([0.75, 0.0])


def test_rl_inside_range_and_masked_garbage():
    # ρ = 1.1, A = 2 → 2.2 on the one masked token; the unmasked -inf must not leak.
    b = rl_batch([-1 + LN(1.1), float("-inf")], [-1, float("-inf")], [1, 0], 2.0)
    loss, m = openclawrl_loss(b, {"eps_low": 0.2, "eps_high": 0.28, "old_logprobs": "engine"})
    assert loss.item() == pytest.approx(-2.2)
    assert m["rl_clip_frac"] == 0.0 and m["tokens"] == 1
    loss.backward()
    assert b["logp_new"].grad.tolist()[0] == pytest.approx([-2.2, 0.0])


def test_rl_custom_eps():
    # ε_low = ε_high = 0.1: ρ = 1.2, A = 1 → 1.1.
    b = rl_batch([LN(1.2)], [0.0], [1], 1.0)
    loss, _ = openclawrl_loss(b, Engine(eps_low=0.1, eps_high=0.1))
    assert loss.item() == pytest.approx(-1.1)


# --- OPD -----------------------------------------------------------------------------------------

def one_token_opd(ratio, diff, reward=0.0):
    """B=1, T=1, K=2, H=1: S_t = {10, 20}, ℓold = OLD2, ℓθ = ℓold + ln ρ, teacher = ℓold + diff."""
    new = [o + LN(r) for o, r in zip(OLD2, ratio)]
    teacher = [o + dd for o, dd in zip(OLD2, diff)]
    return batch([[-1.0]], [[-1.0]], [[1]], [reward], [[[10, 20]]], [[OLD2]], [[new]],
                 [[[teacher]]], [[[[10, 20]]]], [[True]])


def test_opd_hand_value_with_diff_clip_and_ratio_clip():
    # d = (0.5, clip(-2) = -1); ρ = (1.1, 0.5).
    # v=10: min(1.1·0.5, 1.1·0.5) = 0.55; v=20: min(0.5·-1, 0.8·-1) = -0.8 (clipped).
    # Σ w· = 0.75·0.55 + 0.25·-0.8 = 0.2125 → L_OPD = -0.2125.
    b = one_token_opd([1.1, 0.5], [0.5, -2.0])
    loss, m = openclawrl_loss(b, Engine())
    assert m["opd_loss"] == pytest.approx(-0.2125)
    assert m["rl_loss"] == pytest.approx(0.0)  # A = 0
    assert loss.item() == pytest.approx(-0.2125)
    assert m["opd_clip_frac"] == 0.5 and m["mean_abs_d"] == pytest.approx(0.75)
    assert m["chosen_overlap"] == 2 and m["samples_with_teacher"] == 1
    loss.backward()
    # ∂/∂ℓθ(10) = -w·ρ·d = -0.75·1.1·0.5; v=20 is clipped → 0.
    assert b["topk_logp_new"].grad.tolist()[0][0] == pytest.approx([-0.4125, 0.0])


def test_opd_positive_d_clips_high_ratio_and_c_is_configurable():
    # C = 0.25: d = (0.25, 0.25). ρ = (1.5, 1.0): min(0.375, 0.32) = 0.32, min(0.25, 0.25) = 0.25.
    # Σ w· = 0.75·0.32 + 0.25·0.25 = 0.3025.
    b = one_token_opd([1.5, 1.0], [0.9, 0.3])
    _, m = openclawrl_loss(b, Engine(clip_c=0.25))
    assert m["opd_loss"] == pytest.approx(-0.3025)
    assert m["opd_clip_frac"] == 0.5 and m["mean_abs_d"] == pytest.approx(0.25)


def selection_batch(teacher_ids, cand_mask=(True, True)):
    """B=1, T=2, K=2, H=2 with ρ = 1 everywhere, S_0 = {10, 20}, S_1 = {30, 40}. Candidate 0's
    teacher sits 0.4 above ℓold on every entry, candidate 1's 0.4 below, so a token scored with
    candidate 0 adds Σ w·d = +0.4 and with candidate 1 adds -0.4: the loss shows who was chosen."""
    ids = [[[10, 20], [30, 40]]]
    old = [[OLD2, OLD2]]
    up = [[o + 0.4 for o in OLD2]] * 2
    down = [[o - 0.4 for o in OLD2]] * 2
    return batch([[-1.0, -1.0]], [[-1.0, -1.0]], [[1, 1]], [0.0], ids, old, old,
                 [[up, down]], [teacher_ids], [list(cand_mask)])


# Overlaps: cand 0 = (2, 0), cand 1 = (1, 2) → sequence picks 1 (3 > 2), token picks (0, 1).
DISTINCT = [[[10, 20], [50, 60]], [[10, 99], [30, 40]]]
# Overlaps: cand 0 = (2, 0), cand 1 = (1, 1) → sequence tie 2 = 2 → 0; token picks (0, 1).
SEQ_TIE = [[[10, 20], [50, 60]], [[10, 99], [30, 77]]]
# Overlaps: cand 0 = (1, 1), cand 1 = (1, 1) → every tie → 0.
ALL_TIE = [[[10, 98], [30, 97]], [[20, 99], [40, 96]]]


@pytest.mark.parametrize("ids, selection, want_loss, want_overlap", [
    (DISTINCT, "sequence_optimal", 0.4, 1.5),
    (DISTINCT, "token_optimal", 0.0, 2.0),
    (SEQ_TIE, "sequence_optimal", -0.4, 1.0),
    (SEQ_TIE, "token_optimal", 0.0, 1.5),
    (ALL_TIE, "sequence_optimal", -0.4, 1.0),
    (ALL_TIE, "token_optimal", -0.4, 1.0),
])
def test_hint_selection(ids, selection, want_loss, want_overlap):
    _, m = openclawrl_loss(selection_batch(ids), Engine(hint_selection=selection))
    assert m["opd_loss"] == pytest.approx(want_loss)
    assert m["chosen_overlap"] == pytest.approx(want_overlap)


@pytest.mark.parametrize("selection", ["sequence_optimal", "token_optimal"])
def test_invalid_candidate_is_never_chosen(selection):
    # Candidate 0 overlaps fully but is masked off; candidate 1 (overlap 0) must be used: -0.4·-1.
    ids = [[[10, 20], [30, 40]], [[1, 2], [3, 4]]]
    _, m = openclawrl_loss(selection_batch(ids, (False, True)), Engine(hint_selection=selection))
    assert m["opd_loss"] == pytest.approx(0.4) and m["chosen_overlap"] == 0


def test_sequence_selection_ignores_unmasked_tokens():
    # DISTINCT with token 1 unmasked: sums become cand 0 = 2, cand 1 = 1 → candidate 0, one token, +0.4.
    b = selection_batch(DISTINCT)
    b["mask"] = t([[1, 0]])
    _, m = openclawrl_loss(b, Engine())
    assert m["opd_loss"] == pytest.approx(-0.4) and m["tokens"] == 1


def test_padding_ids_do_not_overlap():
    # S_t = {10, pad}; cand 0's own top-K is all padding (-1 == -1 must not count), cand 1 has 10.
    b = batch([[-1.0]], [[-1.0]], [[1]], [0.0], [[[10, -1]]], [[[LN(0.5), float("-inf")]]],
              [[[LN(0.5), float("-inf")]]], [[[[LN(0.5) + 0.3, 0.0]]], [[[LN(0.5) - 0.3, 0.0]]]],
              [[[[-1, -1]]], [[[10, 55]]]], [[True, True]])
    _, m = openclawrl_loss(b, Engine())
    # Only v=10 is valid, w = 1, chosen = cand 1, d = -0.3 → L_OPD = 0.3.
    assert m["chosen_overlap"] == 1 and m["opd_loss"] == pytest.approx(0.3)


def test_repeated_ids_count_once():
    # S_t = {10, 10} (degenerate) against teacher {10, 20}: overlap 1, not 2.
    b = batch([[-1.0]], [[-1.0]], [[1]], [0.0], [[[10, 10]]], [[OLD2]], [[OLD2]], [[[OLD2]]], [[[[10, 20]]]], [[True]])
    _, m = openclawrl_loss(b, Engine())
    assert m["chosen_overlap"] == 1


# --- samples without a teacher, weights, padding ---------------------------------------------------

def two_samples(cand_second):
    """Sample 0 as in test_opd_hand_value (OPD token value 0.2125, A = 0, two tokens both masked:
    the second one identical), sample 1 with A = +1, ρ = 1 on two tokens, teacher tensors NaN."""
    new = [o + LN(r) for o, r in zip(OLD2, [1.1, 0.5])]
    teacher = [OLD2[0] + 0.5, OLD2[1] - 2.0]
    nan = [float("nan")] * 2
    return batch([[-1.0, -1.0], [-2.0, -2.0]], [[-1.0, -1.0], [-2.0, -2.0]], [[1, 1], [1, 1]], [0.0, 1.0],
                 [[[10, 20]] * 2] * 2, [[OLD2] * 2] * 2, [[new] * 2, [OLD2] * 2],
                 [[[teacher] * 2], [[nan] * 2]], [[[[10, 20]] * 2], [[[10, 20]] * 2]], [[True], [cand_second]])


def test_sample_without_candidate_adds_no_opd_term():
    loss, m = openclawrl_loss(two_samples(False), Engine())
    # Sample 0's two tokens give -0.2125 each; sample 1 (no candidate) adds 0 to the OPD sum but,
    # as ARCHITECTURE.md §4 has both means over all masked tokens, counts in its denominator:
    # OPD = 2 * -0.2125 / 4 = -0.10625 (not -0.2125). RL over all four: -(0+0+1+1)/4.
    assert m["opd_loss"] == pytest.approx(-0.10625)
    assert m["rl_loss"] == pytest.approx(-0.5)
    assert loss.item() == pytest.approx(-0.60625)
    assert m["samples_with_teacher"] == 1 and m["tokens"] == 4 and m["opd_tokens"] == 2
    assert m["chosen_overlap"] == 2


def test_no_sample_with_candidate_gives_zero_opd_and_a_usable_graph():
    b = two_samples(False)
    b["cand_mask"] = torch.zeros(2, 1, dtype=torch.bool)
    loss, m = openclawrl_loss(b, Engine())
    assert m["opd_loss"] == 0.0 and m["loss"] == pytest.approx(m["rl_loss"])
    loss.backward()
    assert torch.isfinite(b["logp_new"].grad).all()
    assert (b["topk_logp_new"].grad == 0).all()


def test_zero_teacher_candidates_axis():
    # H = 0: the trainer may send no candidate axis at all.
    b = rl_batch([-1 + LN(1.1)], [-1], [1], 1.0)
    b["teacher_topk_logp"] = torch.zeros(1, 0, 1, 2, dtype=torch.float64)
    b["teacher_top_ids"] = torch.zeros(1, 0, 1, 2, dtype=torch.long)
    b["cand_mask"] = torch.zeros(1, 0, dtype=torch.bool)
    _, m = openclawrl_loss(b, Engine())
    assert m["rl_loss"] == pytest.approx(-1.1) and m["opd_loss"] == 0.0


@pytest.mark.parametrize("w_rl, w_opd, want", [
    (1.0, 0.0, -0.5),
    (0.0, 1.0, -0.10625),
    (2.0, 0.5, 2 * -0.5 + 0.5 * -0.10625),
])
def test_weights(w_rl, w_opd, want):
    loss, m = openclawrl_loss(two_samples(False), Engine(w_rl=w_rl, w_opd=w_opd))
    assert loss.item() == pytest.approx(want) and m["loss"] == pytest.approx(want)
    # The component metrics are unweighted.
    assert m["rl_loss"] == pytest.approx(-0.5) and m["opd_loss"] == pytest.approx(-0.10625)


def test_padding_entries_are_excluded_and_nothing_is_nan():
    # K = 4: S_t = {10, 20} plus an id -1 entry and an engine-floor entry (id 7, ℓold = -10000,
    # ℓθ = 0 would make ρ = e^10000). The value must be exactly the K = 2 hand value, -0.2125.
    inf = float("-inf")
    new = [OLD2[0] + LN(1.1), OLD2[1] + LN(0.5), inf, 0.0]
    teacher = [OLD2[0] + 0.5, OLD2[1] - 2.0, inf, 5.0]
    b = batch([[-1.0, inf]], [[-1.0, inf]], [[1, 0]], [0.0],
              [[[10, 20, -1, 7], [-1, -1, -1, -1]]], [[OLD2 + [inf, LOGPROB_FLOOR], [inf] * 4]],
              [[new, [inf] * 4]], [[[teacher, [inf] * 4]]], [[[[10, 20, -1, -1], [-1] * 4]]], [[True]])
    loss, m = openclawrl_loss(b, Engine())
    assert m["opd_loss"] == pytest.approx(-0.2125)
    assert m["mean_abs_d"] == pytest.approx(0.75) and m["chosen_overlap"] == 2
    assert all(math.isfinite(v) for v in m.values())
    loss.backward()
    assert torch.isfinite(b["logp_new"].grad).all() and torch.isfinite(b["topk_logp_new"].grad).all()
    assert b["topk_logp_new"].grad.tolist()[0][0] == pytest.approx([-0.4125, 0.0, 0.0, 0.0])


def test_masked_position_with_all_padding_subset_counts_zero():
    # A masked token whose whole S_t is padding adds 0 to the OPD sum but is counted: -0.2125 / 2.
    inf = float("-inf")
    b = one_token_opd([1.1, 0.5], [0.5, -2.0])
    for key, pad in [("topk_ids", -1), ("topk_logp_old", inf), ("topk_logp_new", inf),
                     ("teacher_topk_logp", inf), ("teacher_top_ids", -1)]:
        b[key] = torch.cat([b[key].detach(), torch.full_like(b[key][..., :1, :], pad)], dim=-2)
    b["logp_new"] = t([[-1.0, -1.0]]).requires_grad_()
    b["logp_old"], b["mask"] = t([[-1.0, -1.0]]), t([[1, 1]])
    b["topk_logp_new"].requires_grad_()
    loss, m = openclawrl_loss(b, Engine())
    assert m["opd_loss"] == pytest.approx(-0.2125 / 2)
    loss.backward()
    assert torch.isfinite(b["topk_logp_new"].grad).all()


# --- ℓold from the trainer's own forward, truncated importance weights --------------------------

def Trainer(**kw):  # noqa: N802
    return ObjectiveConfig(old_logprobs="trainer", **kw)


def test_trainer_old_logprobs_start_every_ratio_at_one_and_weight_tokens_by_truncated_is():
    # ℓθ − ℓengine = (ln 1.5, ln 3): in engine mode token 0 would be clipped (ρ = 1.5 > 1.28). In
    # trainer mode ℓold = ℓθ (detached): ρ = 1, no clip, and each token is weighted by
    # w = min(π_trainer / π_engine, 2) = (1.5, 2): L = -(1.5·1 + 2·1) / 2.
    b = rl_batch([-1 + LN(1.5), -2 + LN(3.0)], [-1, -2], [1, 1], 1.0)
    loss, m = openclawrl_loss(b, Trainer())
    assert loss.item() == pytest.approx(-1.75)
    assert m["rl_clip_frac"] == 0 and m["tis_weight_mean"] == pytest.approx(1.75) and m["tis_clip_frac"] == 0.5
    loss.backward()
    # ∂ρ/∂ℓθ = 1 at ρ = 1: the gradient is the weighted policy gradient -w·A / N.
    assert b["logp_new"].grad.tolist()[0] == pytest.approx([-0.75, -1.0])
    _, engine = openclawrl_loss(rl_batch([-1 + LN(1.5), -2 + LN(3.0)], [-1, -2], [1, 1], 1.0), Engine())
    assert engine["rl_clip_frac"] == 1.0  # both ratios above 1.28: engine mode gives no gradient at all


@pytest.mark.parametrize("cap, want_loss, want_grad, want_mean, want_capped", [
    (0.0, 1.0, [0.5, 0.5], 1.0, 0.0),  # off: w = 1
    (1.0, 1.0, [0.5, 0.5], 1.0, 1.0),  # w = (min(1.5, 1), min(3, 1))
    (4.0, 2.25, [0.75, 1.5], 2.25, 0.0),
])
def test_tis_cap(cap, want_loss, want_grad, want_mean, want_capped):
    # A = -1 here: the weight scales the push-down as it scales the push-up.
    b = rl_batch([-1 + LN(1.5), -2 + LN(3.0)], [-1, -2], [1, 1], -1.0)
    loss, m = openclawrl_loss(b, Trainer(tis_cap=cap))
    assert loss.item() == pytest.approx(want_loss)
    assert m["tis_weight_mean"] == pytest.approx(want_mean) and m["tis_clip_frac"] == want_capped
    loss.backward()
    assert b["logp_new"].grad.tolist()[0] == pytest.approx(want_grad)


def test_trainer_old_logprobs_in_opd_use_the_trainer_on_the_subset_and_the_weight_of_the_token():
    # ℓθ on S_t = OLD2 + ln(1.1, 0.5) = (ln .66, ln .1) is ℓold now: w = (.66, .1) / .76, d = teacher
    # − ℓθ = (0.5 − ln 1.1, clip(−2 − ln 0.5) = −1), ρ = 1. The token's TIS weight is 1.5.
    b = one_token_opd([1.1, 0.5], [0.5, -2.0])
    b["logp_new"] = t([[-1.0 + LN(1.5)]]).requires_grad_()
    loss, m = openclawrl_loss(b, Trainer(w_rl=0.0))
    w = [0.66 / 0.76, 0.1 / 0.76]
    d = [0.5 - LN(1.1), -1.0]
    assert m["opd_loss"] == pytest.approx(-1.5 * (w[0] * d[0] + w[1] * d[1]))
    assert m["mean_abs_d"] == pytest.approx((abs(d[0]) + 1.0) / 2) and m["opd_clip_frac"] == 0
    loss.backward()
    assert b["topk_logp_new"].grad.tolist()[0][0] == pytest.approx([-1.5 * w[0] * d[0], -1.5 * w[1] * d[1]])
    # The engine's values on S_t take no part (only their padding does).
    b2 = one_token_opd([1.1, 0.5], [0.5, -2.0])
    b2["logp_new"] = t([[-1.0 + LN(1.5)]]).requires_grad_()
    b2["topk_logp_old"] = t([[[[LN(0.3), LN(0.5)]]]]).reshape(1, 1, 2)
    assert openclawrl_loss(b2, Trainer(w_rl=0.0))[1]["opd_loss"] == pytest.approx(m["opd_loss"])


def test_trainer_old_logprobs_keep_the_engine_s_padding():
    # Entry 2 is the engine's floor (outside what it recorded); its trainer value is finite, and it
    # must still be padding, or w would spread over an entry the engine never had.
    new = OLD2 + [LN(0.1)]
    b = batch([[-1.0]], [[-1.0]], [[1]], [0.0], [[[10, 20, 7]]], [[OLD2 + [LOGPROB_FLOOR]]], [[new]],
              [[[[o + 0.4 for o in OLD2] + [0.0]]]], [[[[10, 20, 7]]]], [[True]])
    _, m = openclawrl_loss(b, Trainer(w_rl=0.0))
    assert m["opd_loss"] == pytest.approx(-0.4) and m["entries"] == 2 and m["chosen_overlap"] == 2


# --- shortest hint -------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths, cand, want_loss", [
    ((30, 20), (True, True), -0.4 * -1),  # candidate 1 is shorter: its teacher sits 0.4 below
    ((20, 30), (True, True), -0.4),
    ((25, 25), (True, True), -0.4),  # a tie goes to the lowest index, the TS order (shortest first)
    ((10, 30), (False, True), 0.4),  # an invalid candidate is never chosen, however short
])
def test_shortest_picks_the_fewest_teacher_prompt_tokens_whatever_the_overlap(lengths, cand, want_loss):
    # DISTINCT: overlap prefers candidate 1 by sequence, (0, 1) by token; `shortest` ignores overlap.
    b = selection_batch(DISTINCT, cand)
    b["cand_len"] = torch.tensor([list(lengths)])
    _, m = openclawrl_loss(b, Engine(hint_selection="shortest"))
    assert m["opd_loss"] == pytest.approx(want_loss)


def test_shortest_needs_the_candidates_lengths():
    with pytest.raises(ShimError, match="missing cand_len .hint_selection shortest needs it"):
        openclawrl_loss(selection_batch(DISTINCT), Engine(hint_selection="shortest"))


# --- KL to the base model -----------------------------------------------------------------------

def test_kl_term_adds_its_coefficient_times_the_masked_mean_and_its_gradient():
    b = two_samples(False)
    b["kl"] = t([[0.2, 0.4], [0.6, 99.0]]).requires_grad_()
    b["mask"] = t([[1, 1], [1, 0]])
    base, m0 = openclawrl_loss({k: v for k, v in b.items() if k != "kl"}, Engine())
    loss, m = openclawrl_loss(b, Engine(kl_coef=0.5))
    assert m["kl"] == pytest.approx(0.4) and loss.item() == pytest.approx(base.item() + 0.5 * 0.4)
    loss.backward()
    assert b["kl"].grad.flatten().tolist() == pytest.approx([0.5 / 3, 0.5 / 3, 0.5 / 3, 0.0])
    # Reported, not added, with kl_coef 0; and a kl_coef without the tensor is refused.
    assert openclawrl_loss(b, Engine())[0].item() == pytest.approx(base.item())
    with pytest.raises(ShimError, match="missing kl .kl_coef > 0 needs it"):
        openclawrl_loss({k: v for k, v in b.items() if k != "kl"}, Engine(kl_coef=0.1))
    assert m0["kl"] == 0.0


# --- gradients -----------------------------------------------------------------------------------

def random_batch(seed, B=2, T=3, K=3, H=2):
    """Ratios within 5% of 1 and |ℓT − ℓold| < 0.5, far from every clip boundary, so the loss is
    smooth around the point and gradcheck's finite differences apply."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    old = -0.5 - 2 * u(B, T)
    topk_old = torch.log_softmax(u(B, T, K + 1) * 3, dim=-1)[..., :K]
    ids = torch.stack([torch.randperm(10, generator=g)[:K] for _ in range(B * T)]).reshape(B, T, K)
    return {
        "logp_new": old + 0.1 * (u(B, T) - 0.5),
        "logp_old": old,
        "mask": torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.float64),
        "reward": torch.tensor([1.0, -0.5], dtype=torch.float64),
        "topk_ids": ids,
        "topk_logp_old": topk_old,
        "topk_logp_new": topk_old + 0.1 * (u(B, T, K) - 0.5),
        "teacher_topk_logp": topk_old[:, None] + (u(B, H, T, K) - 0.5),
        "teacher_top_ids": torch.randint(0, 10, (B, H, T, K), generator=g),
        "cand_mask": torch.tensor([[True, True], [False, True]]),
    }


@pytest.mark.parametrize("selection", ["sequence_optimal", "token_optimal"])
def test_gradcheck(selection):
    b = random_batch(0)
    cfg = Engine(w_rl=0.7, w_opd=1.3, hint_selection=selection)

    def f(logp_new, topk_logp_new):
        return openclawrl_loss({**b, "logp_new": logp_new, "topk_logp_new": topk_logp_new}, cfg)[0]

    inputs = (b["logp_new"].clone().requires_grad_(), b["topk_logp_new"].clone().requires_grad_())
    assert torch.autograd.gradcheck(f, inputs)
    _, m = openclawrl_loss(b, cfg)
    assert m["rl_clip_frac"] == 0 and m["opd_clip_frac"] == 0 and m["samples_with_teacher"] == 2


def no_teacher(T, K=3):
    return {"teacher_topk_logp": torch.zeros(1, 1, T, K, dtype=torch.float64),
            "teacher_top_ids": torch.zeros(1, 1, T, K, dtype=torch.long),
            "cand_mask": torch.zeros(1, 1, dtype=torch.bool)}


@pytest.mark.parametrize("reward, sign", [(1.0, 1), (-1.0, -1)])
def test_rl_step_moves_sampled_token_with_the_reward(reward, sign):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.5, 1.0, 1.5]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1, 3])
    before = torch.log_softmax(logits, -1).gather(-1, y[:, None]).squeeze(-1).detach()
    topk = torch.log_softmax(logits, -1).topk(3, dim=-1)
    b = {"logp_new": torch.log_softmax(logits, -1).gather(-1, y[:, None]).squeeze(-1)[None],
         "logp_old": before[None], "mask": torch.ones(1, 2), "reward": torch.tensor([reward]),
         "topk_ids": topk.indices[None], "topk_logp_old": topk.values.detach()[None],
         "topk_logp_new": topk.values[None], **no_teacher(2)}
    openclawrl_loss(b, Engine())[0].backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    after = torch.log_softmax(logits, -1).gather(-1, y[:, None]).squeeze(-1)
    assert ((after - before) * sign > 0).all()


def test_opd_step_pulls_toward_teacher_on_subset():
    # S_t = top-3 of 4 tokens (ids 0, 1, 2, most likely first). The teacher moves 0.6 of log-prob
    # from the first to the third: after a step, ℓθ(2) − ℓθ(0) grows toward ℓT(2) − ℓT(0).
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(logits, -1)
    ids = torch.tensor([[0, 1, 2]])
    old = logp.gather(-1, ids).detach()
    teacher = old + torch.tensor([[-0.6, 0.0, 0.6]], dtype=torch.float64)
    b = {"logp_new": logp[:, :1], "logp_old": old[:, :1], "mask": torch.ones(1, 1), "reward": torch.zeros(1),
         "topk_ids": ids[None], "topk_logp_old": old[None], "topk_logp_new": logp.gather(-1, ids)[None],
         "teacher_topk_logp": teacher[None, None], "teacher_top_ids": ids[None, None],
         "cand_mask": torch.ones(1, 1, dtype=torch.bool)}
    openclawrl_loss(b, Engine(w_rl=0.0))[0].backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    new = torch.log_softmax(logits, -1).gather(-1, ids).detach()
    gap = lambda x: (x[0, 2] - x[0, 0]).item()  # noqa: E731
    assert gap(old) < gap(new) < gap(teacher)


# --- config --------------------------------------------------------------------------------------

def test_objective_from_options_maps_resolved_training():
    resolved = {"wRl": 0.5, "wOpd": 2, "clipC": 1.5, "hintSelection": "token_optimal", "oldLogprobs": "engine",
                "tisCap": 3.0, "klCoef": 0.05, "lr": 1e-5, "epsLow": 0.1, "epsHigh": 0.2, "weightDecay": 0.1,
                "betas": [0.9, 0.98], "clipGrad": 1.0, "topK": 4, "dtype": "fp32", "microBatchTokens": 2048,
                "gradCheckpointing": "off"}
    assert objective_from_options(resolved) == ObjectiveConfig(
        w_rl=0.5, w_opd=2, eps_low=0.1, eps_high=0.2, clip_c=1.5, hint_selection="token_optimal",
        old_logprobs="engine", tis_cap=3.0, kl_coef=0.05)


def test_defaults_match_the_ts_defaults():
    # cluster/config/training.test.ts: parse([]).resolved.
    ts_defaults = {"wRl": 1, "wOpd": 1, "clipC": 1, "hintSelection": "sequence_optimal", "oldLogprobs": "trainer",
                   "tisCap": 2, "klCoef": 0, "lr": 1e-5, "epsLow": 0.2, "epsHigh": 0.28, "weightDecay": 0.1,
                   "betas": [0.9, 0.98], "clipGrad": 1, "topK": 4, "dtype": "fp32", "microBatchTokens": 2048,
                   "gradCheckpointing": "off"}
    assert objective_from_options(ts_defaults) == ObjectiveConfig()
    assert ObjectiveConfig() == ObjectiveConfig(1.0, 1.0, 0.2, 0.28, 1.0, "sequence_optimal", "trainer", 2.0, 0.0)


@pytest.mark.parametrize("cfg", [
    {"hint_selection": "random"}, {"clip_c": 0}, {"w_rl": -1}, {"eps_low": 1.5}, {"eps_high": 0}, {"bogus": 1},
    {"old_logprobs": "rollout"}, {"tis_cap": 0.5}, {"kl_coef": -0.1},
])
def test_bad_config_is_rejected(cfg):
    with pytest.raises(ShimError) as e:
        openclawrl_loss(random_batch(1), cfg)
    assert e.value.code == "REEF_ERR_INVALID_ARGUMENT"


@pytest.mark.parametrize("change, words", [
    (lambda b: b.pop("cand_mask"), "missing cand_mask"),
    (lambda b: b.update(reward=torch.zeros(3, dtype=torch.float64)), "reward has B=3"),
    (lambda b: b.update(topk_ids=b["topk_ids"][..., 0]), "topk_ids has shape"),
])
def test_bad_batch_is_rejected(change, words):
    b = random_batch(2)
    change(b)
    with pytest.raises(ShimError, match=words):
        openclawrl_loss(b, ObjectiveConfig())


def test_a_batch_without_a_masked_token_gives_zero_and_a_finite_gradient():
    # Nothing to train on: no 0/0 in either mean, whatever the unmasked positions hold.
    b = random_batch(3)
    b["mask"] = torch.zeros_like(b["mask"])
    b["logp_new"] = b["logp_new"].clone().fill_(float("inf")).requires_grad_()
    b["topk_logp_new"] = b["topk_logp_new"].clone().requires_grad_()
    loss, m = openclawrl_loss(b, ObjectiveConfig())
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in m.values())
    assert m["tokens"] == 0 and m["opd_tokens"] == 0 and m["rl_clip_frac"] == 0 and m["opd_clip_frac"] == 0
    loss.backward()
    assert (b["logp_new"].grad == 0).all() and (b["topk_logp_new"].grad == 0).all()
