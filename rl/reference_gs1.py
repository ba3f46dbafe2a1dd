"""Independent float64 reference of the GS1 kernel baseline: plain Python loops over i and j.

Written from the semantics pinned in DESIGN.md, without numpy and without anything from rl/:

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

`gs1_kernel_reference` has the signature `rl.checks.check_kernel_against_reference` expects.
"""

from __future__ import annotations

import math


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


def gs1_kernel_reference(
    rewards_B,
    features_B_F,
    history_rewards_H,
    history_features_H_F,
    *,
    bandwidth=0.5,
    window=256,
    min_mass=1e-3,
    scales=None,
    family="gaussian",
):
    """One step. Returns a dict of lists: baseline, advantage, kernel_mass, effective_neighbors,
    fallback."""
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


def gs1_kernel_log_reference(steps, rewards, features, **kernel):
    """A whole log: each run of equal consecutive steps is a batch; every earlier row is history."""
    out = {"baseline": [], "advantage": [], "kernel_mass": [], "effective_neighbors": [], "fallback": []}
    start = 0
    while start < len(steps):
        stop = start
        while stop < len(steps) and steps[stop] == steps[start]:
            stop += 1
        step_out = gs1_kernel_reference(
            rewards[start:stop], features[start:stop], rewards[:start], features[:start], **kernel
        )
        for key in out:
            out[key].extend(step_out[key])
        start = stop
    return out
