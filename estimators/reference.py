"""Independent float64 references of the advantage estimators: plain Python loops.

Written from the semantics pinned in DESIGN.md, without numpy and without anything from rl/ (the
kernel's recipe comes in whole as a `schemas.kernel.KernelSpec`, and only its fields are read).
The preflight compares the arm's own step function with these, and the audit recomputes every
logged row with them. GRPO's reference is the stock cookbook's `compute_advantages` (rl.audit).

GS1 kernel:

    window(step)  = the current batch + the most recent max(0, window - B) earlier rollouts
    z             = each feature minus its window mean, over its window population std
                    (a feature whose window values are all equal contributes z = 0), times scale
    d2_ij         = sum_f (z_if - z_jf)^2,                   j in the window, j != i
    w_ij          = exp(-d2_ij / (2 h^2))                    family "gaussian"
                  = exp(-sqrt(d2_ij) / h)                    family "laplace"
                  = 1 if j is among the k = round(h) others of smallest d2_ij, else 0
                    (ties: the earlier window position first)  family "knn"
    b_i           = sum_j w_ij r_j / sum_j w_ij              when sum_j w_ij >= min_mass
                  = mean of r_j over the window without i    otherwise
                  = r_i                                      when i is alone in its window
    neighbours_i  = (sum_j w_ij)^2 / sum_j w_ij^2            (0 when there is no weight)

Features, built here from the logged columns: log_prompt_num_tokens = log(prompt_num_tokens),
prompt_mean_logprob as logged.

batch_mean:  b_i = mean reward of i's step (i included).
rloo:        b_i = mean reward of the other rollouts of i's group in i's step; r_i when alone.

flash_reinforce (the FlashREINFORCE paper's loss, as its reference flashreinforce/loss.py states it):
    b_i, A_i      = batch_mean's
    p, q          = exp(sampler logprob), exp(learner logprob) of each response token, each
                    clamped into [1e-6, 1 - 1e-6]
    kl_i          = max(0, mean over i's T_i tokens of p log(p/q) + (1-p) log((1-p)/(1-q)))
    admitted_i    = kl_i <= delta                     (no tokens: kl 0, not admitted)
    token adv_i   = A_i / (T_i * B) if admitted_i else 0     B = rollouts of i's step

critic:      b_i = P(yes) / (P(yes) + P(no)) from the logged critic logprobs of i's prompt.
"""

from __future__ import annotations

import math

from schemas.kernel import KernelSpec


def _window_z(window_features, scales):
    n = len(window_features)
    n_features = len(window_features[0])
    z = [[0.0] * n_features for _ in range(n)]
    for f in range(n_features):
        column = [float(window_features[k][f]) for k in range(n)]
        scale = 1.0 if scales is None else float(scales[f])
        first = column[0]
        all_equal = True
        for value in column:
            if value != first:
                all_equal = False
        if all_equal:
            continue  # std 0: no distance along this feature
        total = 0.0
        for value in column:
            total += value
        mean = total / n
        squares = 0.0
        for value in column:
            squares += (value - mean) * (value - mean)
        std = math.sqrt(squares / n)
        for k in range(n):
            z[k][f] = (column[k] - mean) / std * scale
    return z


def gs1_kernel_reference(rewards_B, features_B_F, history_rewards_H, history_features_H_F, kernel: KernelSpec):
    """One step. Returns a dict of lists: baseline, advantage, kernel_mass, effective_neighbors,
    fallback."""
    family, bandwidth, window, min_mass = kernel.family, kernel.bandwidth, kernel.window, kernel.min_mass
    scales = kernel.scales
    batch_size = len(rewards_B)
    n_history = min(len(history_rewards_H), max(0, window - batch_size))
    first_history = len(history_rewards_H) - n_history
    window_rewards = [float(r) for r in history_rewards_H[first_history:]] + [float(r) for r in rewards_B]
    window_features = [list(row) for row in history_features_H_F[first_history:]] + [list(row) for row in features_B_F]
    n = len(window_rewards)
    z = _window_z(window_features, scales)

    out = {"baseline": [], "advantage": [], "kernel_mass": [], "effective_neighbors": [], "fallback": []}
    for b in range(batch_size):
        i = n_history + b
        distances = []  # (d2, j) for every other window rollout
        for j in range(n):
            if j == i:
                continue
            distance2 = 0.0
            for f in range(len(z[i])):
                distance2 += (z[i][f] - z[j][f]) ** 2
            distances.append((distance2, j))
        if family == "knn":
            k = int(round(bandwidth))
            nearest = set(j for _, j in sorted(distances)[:k])  # tuples sort by d2, then by j
        mass = 0.0
        weighted = 0.0
        squared = 0.0
        others = 0.0
        for distance2, j in distances:
            if family == "gaussian":
                w = math.exp(-distance2 / (2.0 * bandwidth * bandwidth))
            elif family == "laplace":
                w = math.exp(-math.sqrt(distance2) / bandwidth)
            elif family == "knn":
                w = 1.0 if j in nearest else 0.0
            else:
                raise ValueError(f"unknown family {family!r}")
            mass += w
            weighted += w * window_rewards[j]
            squared += w * w
            others += window_rewards[j]
        fallback = mass < min_mass
        if n == 1:
            baseline = window_rewards[i]
        elif fallback:
            baseline = others / (n - 1)
        else:
            baseline = weighted / mass
        out["baseline"].append(baseline)
        out["advantage"].append(window_rewards[i] - baseline)
        out["kernel_mass"].append(mass)
        out["effective_neighbors"].append(mass * mass / squared if squared > 0 else 0.0)
        out["fallback"].append(fallback)
    return out


def _step_runs(steps):
    """[start, stop) of each run of equal consecutive steps."""
    runs, start = [], 0
    while start < len(steps):
        stop = start
        while stop < len(steps) and steps[stop] == steps[start]:
            stop += 1
        runs.append((start, stop))
        start = stop
    return runs


def gs1_kernel_log_reference(steps, rewards, features, kernel: KernelSpec):
    """A whole log: each run of equal consecutive steps is a batch; every earlier row is history."""
    out = {"baseline": [], "advantage": [], "kernel_mass": [], "effective_neighbors": [], "fallback": []}
    for start, stop in _step_runs(steps):
        step_out = gs1_kernel_reference(rewards[start:stop], features[start:stop], rewards[:start], features[:start], kernel)
        for key in out:
            out[key].extend(step_out[key])
    return out


def reference_features(prompt_num_tokens, prompt_mean_logprob, kernel: KernelSpec):
    """Each rollout's kernel features, one per name of `kernel.features`, from the logged columns."""
    rows = []
    for num_tokens, mean_logprob in zip(prompt_num_tokens, prompt_mean_logprob):
        row = []
        for name in kernel.features:
            if name == "log_prompt_num_tokens":
                row.append(math.log(float(num_tokens)))
            elif name == "prompt_mean_logprob":
                row.append(float(mean_logprob))
            else:
                raise ValueError(f"unknown feature {name!r}")
        rows.append(row)
    return rows


def batch_mean_log_reference(steps, rewards):
    """b_i = mean reward of i's step. Returns a dict of lists: baseline, advantage."""
    out = {"baseline": [], "advantage": []}
    for start, stop in _step_runs(steps):
        total = 0.0
        for r in rewards[start:stop]:
            total += float(r)
        mean = total / (stop - start)
        for r in rewards[start:stop]:
            out["baseline"].append(mean)
            out["advantage"].append(float(r) - mean)
    return out


def rloo_log_reference(steps, group_ids, rewards):
    """b_i = mean reward of the other rollouts of i's group in i's step; a group of one: b_i = r_i."""
    out = {"baseline": [], "advantage": []}
    for start, stop in _step_runs(steps):
        for i in range(start, stop):
            total, count = 0.0, 0
            for j in range(start, stop):
                if j != i and group_ids[j] == group_ids[i]:
                    total += float(rewards[j])
                    count += 1
            baseline = total / count if count else float(rewards[i])
            out["baseline"].append(baseline)
            out["advantage"].append(float(rewards[i]) - baseline)
    return out


def flash_reinforce_log_reference(steps, rewards, sampler_logprobs, learner_logprobs, delta):
    """A whole flash_reinforce log. Returns a dict of lists: baseline, advantage, sequence_kl,
    admitted, token_advantage."""
    low, high = 1e-6, 1.0 - 1e-6
    out = {"baseline": [], "advantage": [], "sequence_kl": [], "admitted": [], "token_advantage": []}
    batch = batch_mean_log_reference(steps, rewards)
    for start, stop in _step_runs(steps):
        size = stop - start
        for i in range(start, stop):
            tokens = len(sampler_logprobs[i])
            if len(learner_logprobs[i]) != tokens:
                raise ValueError(f"row {i}: {tokens} sampler logprobs but {len(learner_logprobs[i])} learner logprobs")
            total = 0.0
            for s, l in zip(sampler_logprobs[i], learner_logprobs[i]):
                p = min(max(math.exp(float(s)), low), high)
                q = min(max(math.exp(float(l)), low), high)
                total += p * (math.log(p) - math.log(q)) + (1.0 - p) * (math.log(1.0 - p) - math.log(1.0 - q))
            kl = max(0.0, total / tokens) if tokens else 0.0
            admitted = tokens > 0 and kl <= delta
            out["baseline"].append(batch["baseline"][i])
            out["advantage"].append(batch["advantage"][i])
            out["sequence_kl"].append(kl)
            out["admitted"].append(admitted)
            out["token_advantage"].append(batch["advantage"][i] / (tokens * size) if admitted else 0.0)
    return out


def critic_log_reference(rewards, critic_yes_logprob, critic_no_logprob):
    """b_i = P(yes) / (P(yes) + P(no)) from the logged logprobs. Returns baseline, advantage."""
    out = {"baseline": [], "advantage": []}
    for r, yes, no in zip(rewards, critic_yes_logprob, critic_no_logprob):
        p_yes, p_no = math.exp(float(yes)), math.exp(float(no))
        if p_yes + p_no > 0:
            baseline = p_yes / (p_yes + p_no)
        else:  # both underflow: the same ratio from the difference
            baseline = 1.0 / (1.0 + math.exp(float(no) - float(yes)))
        out["baseline"].append(baseline)
        out["advantage"].append(float(r) - baseline)
    return out
