"""Plain float64 NumPy reference implementations of the contrastive objectives.

These functions are the ground truth the vectorised PyTorch objectives are tested
against. They are written directly from the papers' formulas (see the docstring of
each function for the formula and the section it comes from) with explicit Python
loops over anchors, so that they can be read side by side with the papers. Only
``numpy`` and ``math`` are used; there is deliberately no ``torch`` import here.

Conventions shared by every function (docs/design.md, "Objectives: one formulation")
------------------------------------------------------------------------------------
* Inputs are NumPy arrays; everything is computed in float64.
* Embeddings are L2-normalised INSIDE each function, row by row, as
  ``x / max(||x||_2, 1e-12)`` (the same eps as ``torch.nn.functional.normalize``).
* Multi-view layout: ``z`` has shape ``[N, V, D]`` (N samples, V views). It is
  flattened sample-major, so row ``a = n * V + v`` holds view ``v`` of sample ``n``.
  Every one of the ``N * V`` rows is an anchor.
* Candidates are all ``N * V`` batch rows, followed (where a function takes a
  ``bank``) by the bank rows, appended AFTER the batch rows. An anchor's own row is
  never a candidate: it is excluded from every numerator and every denominator.
  Bank rows are never "own rows" (even when they equal a batch row).
* Logits: ``s_ij = cos(z_i, c_j) / tau``.
* An anchor without any positive contributes nothing and is excluded from the mean;
  a loss is the mean over anchors that have at least one positive; if no anchor has
  a positive the loss is ``0.0``.
* No hidden ``tau / base_tau`` factor anywhere.
* Every log-softmax is computed literally as ``s - logsumexp(denominator set)``
  with a max-subtracting log-sum-exp written below (``_logsumexp``), so the values
  stay finite for tau as small as 1e-3.
* Every function returns a Python ``float``.
* No function writes into its inputs (no in-place operations on caller arrays), so
  a caller can perturb an input array and take central finite differences.
"""

from __future__ import annotations

import math

import numpy as np

_NORM_EPS = 1e-12


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def _normalize(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation in float64: x / max(||x||, 1e-12). Returns a new array."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return x / np.maximum(norms, _NORM_EPS)


def _logsumexp(values) -> float:
    """Stable log(sum(exp(values))) with max subtraction. Empty input -> -inf."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return -math.inf
    m = float(np.max(v))
    if m == -math.inf:
        return -math.inf
    return m + math.log(float(np.sum(np.exp(v - m))))


def _flatten_views(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """[N, V, D] -> (normalised rows [N*V, D], sample index of each row [N*V], N, V).

    Row a = n * V + v (sample-major)."""
    z = np.asarray(z, dtype=np.float64)
    if z.ndim != 3:
        raise ValueError(f"expected z of shape [N, V, D], got {z.shape}")
    n, v, d = z.shape
    rows = _normalize(z.reshape(n * v, d))
    sample_of_row = np.repeat(np.arange(n), v)  # row a -> a // V
    return rows, sample_of_row, n, v


def _candidates(rows: np.ndarray, bank) -> np.ndarray:
    """Batch rows followed by (normalised) bank rows."""
    if bank is None:
        return rows
    bank = _normalize(np.asarray(bank, dtype=np.float64).reshape(-1, rows.shape[1]))
    return np.concatenate([rows, bank], axis=0)


def _candidate_keys(row_keys: np.ndarray, bank, bank_keys, what: str) -> np.ndarray:
    """Per-candidate key (sample id or label): batch rows' keys then the bank's keys."""
    if bank is None:
        return row_keys
    if bank_keys is None:
        raise ValueError(f"a bank was given without bank {what}")
    bank_keys = np.asarray(bank_keys).reshape(-1)
    bank = np.asarray(bank)
    n_bank = 0 if bank.size == 0 else bank.reshape(-1, bank.shape[-1]).shape[0]
    if bank_keys.shape[0] != n_bank:
        raise ValueError(f"bank has {n_bank} rows but {bank_keys.shape[0]} bank {what}")
    return np.concatenate([row_keys, bank_keys])


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two already-normalised vectors."""
    return float(np.dot(a, b))


# ---------------------------------------------------------------------------
# SupCon-family with "positives" (InfoNCE / SimCLR, SupCon L_out, SupCon L_in)
# ---------------------------------------------------------------------------


def _supcon_out_core(
    rows: np.ndarray, cands: np.ndarray, row_keys: np.ndarray, cand_keys: np.ndarray, tau: float
) -> float:
    """SupCon L_out with P(i) = {candidates j != i with key_j == key_i}.

    loss_i = -(1/|P(i)|) * sum_{p in P(i)} log( exp(s_ip) / sum_{k != i} exp(s_ik) )
    """
    n_rows, n_cands = rows.shape[0], cands.shape[0]
    per_anchor = []
    for i in range(n_rows):
        # Logits of anchor i against every candidate except its own row i.
        others = [j for j in range(n_cands) if j != i]
        s = {j: _cos(rows[i], cands[j]) / tau for j in others}
        positives = [j for j in others if cand_keys[j] == row_keys[i]]
        if not positives:
            continue  # anchor without a positive: excluded from the mean
        log_denominator = _logsumexp([s[k] for k in others])  # sum_{k != i} exp(s_ik)
        total = 0.0
        for p in positives:
            log_prob_ip = s[p] - log_denominator  # log( exp(s_ip) / sum_{k!=i} exp(s_ik) )
            total += -log_prob_ip
        per_anchor.append(total / len(positives))
    if not per_anchor:
        return 0.0
    return float(sum(per_anchor) / len(per_anchor))


def infonce(z, tau, sample_ids=None, bank=None, bank_ids=None) -> float:
    """InfoNCE / SimCLR (NT-Xent), multi-view, in SupCon's L_out form.

    SupCon paper Eq. 1 (self-supervised) generalised to V views exactly as Eq. 2:
    positives of anchor i = (n, v) are P(i) = the other views of the same sample
    (all batch rows with the same sample id, i excluded; ``sample_ids[n]`` defaults
    to ``n``) plus the bank rows whose id equals that sample id.

        loss_i = -(1/|P(i)|) * sum_{p in P(i)} log( exp(s_ip) / sum_{k != i} exp(s_ik) )

    Denominator: all candidates (batch rows then bank rows) except i.
    Loss = mean over anchors with |P(i)| >= 1 (0.0 if none).

    Args:
        z: [N, V, D] embeddings (normalised inside).
        tau: temperature.
        sample_ids: optional [N] ids; rows of samples that share an id are positives.
        bank: optional [K, D] extra candidates (normalised inside).
        bank_ids: [K] ids of the bank rows (required when ``bank`` is given).
    """
    rows, sample_of_row, n, _ = _flatten_views(z)
    ids = np.arange(n) if sample_ids is None else np.asarray(sample_ids).reshape(-1)
    if ids.shape[0] != n:
        raise ValueError(f"expected {n} sample ids, got {ids.shape[0]}")
    row_ids = ids[sample_of_row]
    cands = _candidates(rows, bank)
    cand_ids = _candidate_keys(row_ids, bank, bank_ids, "ids")
    return _supcon_out_core(rows, cands, row_ids, cand_ids, float(tau))


def supcon_out(z, labels, tau, bank=None, bank_labels=None) -> float:
    """Supervised Contrastive loss, L_out^sup (Khosla et al. 2020, supcon.txt Eq. 2).

        L_out = sum_i -(1/|P(i)|) * sum_{p in P(i)} log( exp(z_i.z_p/tau) / sum_{a in A(i)} exp(z_i.z_a/tau) )

    A(i) = all candidates except i (batch rows, then bank rows);
    P(i) = {p in A(i) : label_p == label_i}.
    Reported as the mean over anchors with |P(i)| >= 1 (0.0 if none).

    Args:
        z: [N, V, D]; labels: [N] (one per sample, shared by its V views);
        bank: optional [K, D]; bank_labels: [K] (required with ``bank``).
    """
    rows, sample_of_row, n, _ = _flatten_views(z)
    labels = np.asarray(labels).reshape(-1)
    if labels.shape[0] != n:
        raise ValueError(f"expected {n} labels, got {labels.shape[0]}")
    row_labels = labels[sample_of_row]
    cands = _candidates(rows, bank)
    cand_labels = _candidate_keys(row_labels, bank, bank_labels, "labels")
    return _supcon_out_core(rows, cands, row_labels, cand_labels, float(tau))


def supcon_in(z, labels, tau, bank=None, bank_labels=None) -> float:
    """Supervised Contrastive loss, L_in^sup (Khosla et al. 2020, supcon.txt Eq. 3).

        L_in = sum_i -log( (1/|P(i)|) * sum_{p in P(i)} exp(z_i.z_p/tau) / sum_{a in A(i)} exp(z_i.z_a/tau) )

    Same A(i), P(i) as ``supcon_out``. By Jensen's inequality L_in <= L_out.
    Reported as the mean over anchors with |P(i)| >= 1 (0.0 if none).
    """
    rows, sample_of_row, n, _ = _flatten_views(z)
    labels = np.asarray(labels).reshape(-1)
    if labels.shape[0] != n:
        raise ValueError(f"expected {n} labels, got {labels.shape[0]}")
    row_labels = labels[sample_of_row]
    cands = _candidates(rows, bank)
    cand_labels = _candidate_keys(row_labels, bank, bank_labels, "labels")
    tau = float(tau)

    per_anchor = []
    for i in range(rows.shape[0]):
        others = [j for j in range(cands.shape[0]) if j != i]
        s = {j: _cos(rows[i], cands[j]) / tau for j in others}
        positives = [j for j in others if cand_labels[j] == row_labels[i]]
        if not positives:
            continue
        log_denominator = _logsumexp([s[k] for k in others])
        # log( (1/|P|) * sum_p exp(s_ip) / denom )
        #   = logsumexp_p(s_ip) - log|P| - log denom
        log_inside = (
            _logsumexp([s[p] for p in positives]) - math.log(len(positives)) - log_denominator
        )
        per_anchor.append(-log_inside)
    if not per_anchor:
        return 0.0
    return float(sum(per_anchor) / len(per_anchor))


# ---------------------------------------------------------------------------
# X-CLR
# ---------------------------------------------------------------------------


def xclr(z, graph, tau, tau_s) -> float:
    """X-CLR (xclr.txt Sec. 2.2; SupCon connection in App. A.14).

    With rows i, j of the flattened batch (N*V rows, no bank):
        p_ij = exp(s_ij) / sum_{k != i} exp(s_ik)                       (j != i)
        t_ij = exp(G_ij / tau_s) / sum_{k != i} exp(G_ik / tau_s)       (j != i), t_ii = 0
        loss_i = H(t_i, p_i) = -sum_{j != i} t_ij * log p_ij
    Loss = mean over ALL anchors (there is no notion of "positive" here) provided
    there are >= 2 rows; otherwise 0.0. As tau_s -> 0 with a class graph whose
    diagonal is 1 and off-diagonal < 1, t_i becomes uniform over P(i) and X-CLR
    becomes SupCon L_out (App. A.14).

    Args:
        z: [N, V, D] embeddings.
        graph: [N*V, N*V] similarity G between rows (already expanded to rows; see
            ``xclr_class_graph`` / ``xclr_caption_graph``).
        tau: temperature of the learned similarities; tau_s: temperature of the targets.
    """
    rows, _, _, _ = _flatten_views(z)
    g = np.asarray(graph, dtype=np.float64)
    m = rows.shape[0]
    if g.shape != (m, m):
        raise ValueError(f"expected graph of shape {(m, m)}, got {g.shape}")
    if m < 2:
        return 0.0
    tau, tau_s = float(tau), float(tau_s)

    per_anchor = []
    for i in range(m):
        others = [j for j in range(m) if j != i]
        s = {j: _cos(rows[i], rows[j]) / tau for j in others}
        log_p_denominator = _logsumexp([s[k] for k in others])
        log_t_denominator = _logsumexp([g[i, k] / tau_s for k in others])
        loss_i = 0.0
        for j in others:
            t_ij = math.exp(g[i, j] / tau_s - log_t_denominator)
            log_p_ij = s[j] - log_p_denominator
            loss_i += -t_ij * log_p_ij
        per_anchor.append(loss_i)
    return float(sum(per_anchor) / len(per_anchor))


def xclr_class_graph(labels, class_sim, V) -> np.ndarray:
    """Row graph from a class-similarity matrix: G_ab = class_sim[labels[n_a], labels[n_b]],
    where n_a = a // V is the sample of row a. Returns [N*V, N*V] float64."""
    labels = np.asarray(labels).reshape(-1)
    class_sim = np.asarray(class_sim, dtype=np.float64)
    n = labels.shape[0]
    m = n * int(V)
    g = np.zeros((m, m), dtype=np.float64)
    for a in range(m):
        for b in range(m):
            g[a, b] = class_sim[labels[a // V], labels[b // V]]
    return g


def xclr_caption_graph(captions, V) -> np.ndarray:
    """Row graph from caption embeddings: G_ab = cos(captions[n_a], captions[n_b]),
    n_a = a // V. captions: [N, E]. Returns [N*V, N*V] float64."""
    caps = _normalize(np.asarray(captions, dtype=np.float64))
    n = caps.shape[0]
    m = n * int(V)
    g = np.zeros((m, m), dtype=np.float64)
    for a in range(m):
        for b in range(m):
            g[a, b] = _cos(caps[a // V], caps[b // V])
    return g


# ---------------------------------------------------------------------------
# SINCERE / epsilon-SupInfoNCE
# ---------------------------------------------------------------------------


def sincere(z, labels, tau, epsilon=0.0) -> float:
    """SINCERE (sincere.txt Sec. 3.3, Eq. 12) and epsilon-SupInfoNCE (Sec. 3.5, Eq. 15).

    For anchor i: P(i) = rows with the same label, i excluded; N(i) = rows with a
    different label. Each positive p is contrasted only against itself and the
    negatives (other same-class rows never enter the denominator):

        loss_i = (1/|P(i)|) * sum_{p in P(i)}
                 -log( exp(s_ip) / ( exp((cos_ip - epsilon)/tau) + sum_{n in N(i)} exp(s_in) ) )

    epsilon = 0 is SINCERE exactly; epsilon > 0 is epsilon-SupInfoNCE (Barbano et
    al. 2023), epsilon in cosine units. Loss = mean over anchors with |P(i)| >= 1
    (0.0 if none). No bank.
    """
    rows, sample_of_row, n, _ = _flatten_views(z)
    labels = np.asarray(labels).reshape(-1)
    if labels.shape[0] != n:
        raise ValueError(f"expected {n} labels, got {labels.shape[0]}")
    row_labels = labels[sample_of_row]
    tau, epsilon = float(tau), float(epsilon)
    m = rows.shape[0]

    per_anchor = []
    for i in range(m):
        others = [j for j in range(m) if j != i]
        cos = {j: _cos(rows[i], rows[j]) for j in others}
        positives = [j for j in others if row_labels[j] == row_labels[i]]
        negatives = [j for j in others if row_labels[j] != row_labels[i]]
        if not positives:
            continue
        total = 0.0
        for p in positives:
            s_ip = cos[p] / tau
            denominator_terms = [(cos[p] - epsilon) / tau] + [cos[q] / tau for q in negatives]
            total += -(s_ip - _logsumexp(denominator_terms))
        per_anchor.append(total / len(positives))
    if not per_anchor:
        return 0.0
    return float(sum(per_anchor) / len(per_anchor))


# ---------------------------------------------------------------------------
# CoNe
# ---------------------------------------------------------------------------


def cone_parts(
    q,
    k,
    q_logits,
    labels,
    bank,
    bank_labels,
    bank_probs,
    lambda_sup,
    lambda_dc,
    tau_sup,
    tau_dc,
    top_n,
    label_smoothing=0.0,
    neighbours_from="key",
) -> dict:
    """The three CoNe terms (cone.txt Eq. 1, 2, 7, 9-13 and Algorithm 1), V = 1.

    q: [N, D] query embeddings (latest network), k: [N, D] EMA-key embeddings,
    q_logits: [N, C] classifier logits of the query, labels: [N],
    bank: [K, D] stored (EMA) features, bank_labels: [K], bank_probs: [K, C]
    stored class-probability rows. q, k and bank are normalised inside.

    * ce (Eq. 1): mean_i CE(q_logits_i, y_i), with label smoothing eps as torch does:
          target = (1 - eps) * onehot(y_i) + eps / C;  ce_i = -sum_c target_c * log softmax(q_logits_i)_c
    * sup_in (Eq. 2 over the top-N bank neighbours, Sec. 3.3): J_i = the top_n bank
      rows by cos(k_i, bank_j) (chosen with the EMA KEY, or with the query q_i when
      neighbours_from="query"; all K rows if top_n > K; ties broken towards the lower bank
      index). Over J_i:
          w_ij = exp(cos(q_i, bank_j)/tau_sup) / sum_{l in J_i} exp(cos(q_i, bank_l)/tau_sup)
          loss_i = -log sum_{j in J_i, bank_labels_j == y_i} w_ij
      (this is Eq. 2 with Pos/Neg restricted to J_i). Anchors with no same-label
      neighbour in J_i are excluded; mean over the rest, 0.0 if none.
    * dc (Eq. 10-12): p_inst_ij = softmax over ALL K bank rows of cos(k_i, bank_j)/tau_dc;
          p_dc_i = sum_j p_inst_ij * bank_probs_j;  p_class_i = softmax(q_logits_i);
          dc_i = KL(p_dc_i || p_class_i) = sum_c p_dc_ic * log(p_dc_ic / p_class_ic)  (0 log 0 = 0)
      mean over all i.
    If K == 0 (empty bank) sup_in = dc = 0.
    ``lambda_sup`` and ``lambda_dc`` are accepted for a uniform signature; unused here.
    """
    del lambda_sup, lambda_dc  # only used by ``cone``
    q_logits = np.asarray(q_logits, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1)
    n_anchors, n_classes = q_logits.shape
    eps = float(label_smoothing)
    tau_sup, tau_dc = float(tau_sup), float(tau_dc)

    # log softmax of the classifier logits, literally: logit - logsumexp(logits)
    log_p_class = []
    for i in range(n_anchors):
        lse = _logsumexp(q_logits[i])
        log_p_class.append(np.array([q_logits[i, c] - lse for c in range(n_classes)]))

    # ---- L_ce (Eq. 1) with torch-style label smoothing -------------------------
    ce_terms = []
    for i in range(n_anchors):
        ce_i = 0.0
        for c in range(n_classes):
            target_c = (1.0 - eps) * (1.0 if c == labels[i] else 0.0) + eps / n_classes
            ce_i += -target_c * log_p_class[i][c]
        ce_terms.append(ce_i)
    ce = float(sum(ce_terms) / len(ce_terms)) if ce_terms else 0.0

    bank_arr = np.asarray(bank, dtype=np.float64)
    n_bank = 0 if bank_arr.size == 0 else bank_arr.reshape(-1, bank_arr.shape[-1]).shape[0]
    if n_bank == 0 or n_anchors == 0:
        return {"ce": ce, "sup_in": 0.0, "dc": 0.0}

    qn = _normalize(np.asarray(q, dtype=np.float64))
    kn = _normalize(np.asarray(k, dtype=np.float64))
    bn = _normalize(bank_arr.reshape(n_bank, -1))
    if bn.shape[1] != qn.shape[1] or kn.shape != qn.shape:
        raise ValueError(f"shape mismatch: q {qn.shape}, k {kn.shape}, bank {bn.shape}")
    bank_labels = np.asarray(bank_labels).reshape(-1)
    bank_probs = np.asarray(bank_probs, dtype=np.float64)

    # ---- L_in^sup over the top-N neighbours of the EMA key or query (Eq. 2, Sec. 3.3) ---
    n_top = min(int(top_n), n_bank)
    chooser = {"key": kn, "query": qn}[neighbours_from]
    in_terms = []
    for i in range(n_anchors):
        key_sims = np.array([_cos(chooser[i], bn[j]) for j in range(n_bank)])
        order = np.argsort(-key_sims, kind="stable")  # descending; ties -> lower index
        neighbours = [int(j) for j in order[:n_top]]
        same_label = [j for j in neighbours if bank_labels[j] == labels[i]]
        if not same_label:
            continue  # no positive neighbour: term discarded
        s = {j: _cos(qn[i], bn[j]) / tau_sup for j in neighbours}
        log_w_pos = _logsumexp([s[j] for j in same_label]) - _logsumexp([s[j] for j in neighbours])
        in_terms.append(-log_w_pos)
    sup_in = float(sum(in_terms) / len(in_terms)) if in_terms else 0.0

    # ---- L_dc: KL(p_dc || p_class) (Eq. 10-12) ---------------------------------
    dc_terms = []
    for i in range(n_anchors):
        s = [_cos(kn[i], bn[j]) / tau_dc for j in range(n_bank)]
        lse = _logsumexp(s)
        p_inst = [math.exp(s[j] - lse) for j in range(n_bank)]  # Eq. 10
        p_dc = np.zeros(n_classes)
        for j in range(n_bank):
            p_dc = p_dc + p_inst[j] * bank_probs[j]  # Eq. 11
        kl = 0.0
        for c in range(n_classes):
            if p_dc[c] > 0.0:  # 0 * log 0 = 0
                kl += p_dc[c] * (math.log(p_dc[c]) - log_p_class[i][c])
        dc_terms.append(kl)
    dc = float(sum(dc_terms) / len(dc_terms))
    return {"ce": ce, "sup_in": sup_in, "dc": dc}


def cone(
    q,
    k,
    q_logits,
    labels,
    bank,
    bank_labels,
    bank_probs,
    lambda_sup,
    lambda_dc,
    tau_sup,
    tau_dc,
    top_n,
    label_smoothing=0.0,
    neighbours_from="key",
) -> float:
    """CoNe overall objective (cone.txt Eq. 13):

        L = L_ce + lambda_sup * L_in^sup + lambda_dc * L_dc

    See ``cone_parts`` for each term.
    """
    parts = cone_parts(
        q,
        k,
        q_logits,
        labels,
        bank,
        bank_labels,
        bank_probs,
        lambda_sup,
        lambda_dc,
        tau_sup,
        tau_dc,
        top_n,
        label_smoothing,
        neighbours_from,
    )
    return float(parts["ce"] + float(lambda_sup) * parts["sup_in"] + float(lambda_dc) * parts["dc"])


# ---------------------------------------------------------------------------
# CLIP / LiT baseline
# ---------------------------------------------------------------------------


def clip(image, captions, tau) -> float:
    """Symmetric CLIP loss (Radford et al. 2021) between image views and captions.

    image: [N, V, D] image embeddings; captions: [N, D] caption embeddings already
    projected to D by a head. Both normalised inside. For each view v separately:
        L_nm = cos(img[n, v], cap[m]) / tau
        i2t_v = mean_n -log( exp(L_nn) / sum_m exp(L_nm) )
        t2i_v = mean_n -log( exp(L_nn) / sum_m exp(L_mn) )
        loss_v = (i2t_v + t2i_v) / 2
    Returns mean_v loss_v.
    """
    image = np.asarray(image, dtype=np.float64)
    if image.ndim != 3:
        raise ValueError(f"expected image of shape [N, V, D], got {image.shape}")
    n, n_views, _ = image.shape
    caps = _normalize(np.asarray(captions, dtype=np.float64))
    if n == 0:
        return 0.0
    tau = float(tau)
    per_view = []
    for v in range(n_views):
        img = _normalize(image[:, v, :])
        logits = np.array([[_cos(img[a], caps[b]) / tau for b in range(n)] for a in range(n)])
        i2t = 0.0
        t2i = 0.0
        for a in range(n):
            i2t += -(logits[a, a] - _logsumexp([logits[a, b] for b in range(n)]))
            t2i += -(logits[a, a] - _logsumexp([logits[b, a] for b in range(n)]))
        per_view.append((i2t / n + t2i / n) / 2.0)
    return float(sum(per_view) / len(per_view))


# ---------------------------------------------------------------------------
# Self-checks of the identities docs/design.md lists
# ---------------------------------------------------------------------------


if __name__ == "__main__":
    rng = np.random.default_rng(0)

    def _check(name: str, ok: bool, detail: str) -> None:
        print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}")
        if not ok:
            raise SystemExit(1)

    # (a) identical embeddings: every logit equal -> loss = log(2N - 1)
    for n in (1, 2, 5, 16):
        got = infonce(np.ones((n, 2, 4)), 0.07)
        want = math.log(2 * n - 1)
        _check(
            f"(a) infonce identical N={n}",
            abs(got - want) < 1e-12,
            f"{got:.12f} vs log(2N-1)={want:.12f}",
        )

    # (b) SupCon L_out with all-unique labels == InfoNCE (also with a bank, V=3, tiny tau)
    for tau in (0.1, 0.001):
        z = rng.normal(size=(6, 3, 5))
        bank = rng.normal(size=(4, 5))
        ids = np.array([0, 1, 2, 3, 4, 5])
        bank_ids = np.array([1, 7, 3, 9])
        a = infonce(z, tau, sample_ids=ids, bank=bank, bank_ids=bank_ids)
        b = supcon_out(z, ids, tau, bank=bank, bank_labels=bank_ids)
        _check(
            f"(b) supcon_out(unique) == infonce, tau={tau}",
            abs(a - b) < 1e-9 * max(1, abs(a)),
            f"{b:.12f} vs {a:.12f}",
        )

    # (c) SINCERE with unique labels, V=2 == InfoNCE; epsilon>0 lowers the value at fixed z
    for tau in (0.5, 0.07, 0.001):
        z = rng.normal(size=(7, 2, 6))
        labels = np.arange(7)
        a = infonce(z, tau)
        b = sincere(z, labels, tau)
        _check(
            f"(c) sincere(unique, V=2) == infonce, tau={tau}",
            abs(a - b) < 1e-9 * max(1, abs(a)),
            f"{b:.12f} vs {a:.12f}",
        )
    z = rng.normal(size=(8, 2, 6))
    labels = np.array([0, 0, 1, 1, 1, 2, 3, 0])
    s0, s1 = sincere(z, labels, 0.1), sincere(z, labels, 0.1, epsilon=0.2)
    _check("(c') eps-SupInfoNCE(eps=0.2) < SINCERE", s1 < s0, f"{s1:.6f} < {s0:.6f}")

    # (d) Jensen: L_in <= L_out, on random data with repeated labels (+ bank)
    worst = -math.inf
    for _trial in range(20):
        z = rng.normal(size=(8, 2, 5))
        labels = rng.integers(0, 3, size=8)
        bank = rng.normal(size=(5, 5))
        bank_labels = rng.integers(0, 3, size=5)
        lo = supcon_out(z, labels, 0.2, bank=bank, bank_labels=bank_labels)
        li = supcon_in(z, labels, 0.2, bank=bank, bank_labels=bank_labels)
        worst = max(worst, li - lo)
    _check(
        "(d) supcon_in <= supcon_out (20 random batches)",
        worst <= 1e-12,
        f"max(L_in - L_out) = {worst:.3e}",
    )

    # (e) X-CLR with class graph, tau_s -> 0 approaches SupCon L_out
    n_classes = 4
    class_sim = rng.uniform(-0.5, 0.9, size=(n_classes, n_classes))
    class_sim = (class_sim + class_sim.T) / 2
    np.fill_diagonal(class_sim, 1.0)
    z = rng.normal(size=(9, 2, 6))
    labels = rng.integers(0, n_classes, size=9)
    g = xclr_class_graph(labels, class_sim, 2)
    a = supcon_out(z, labels, 0.1)
    for tau_s in (1e-1, 1e-2, 1e-4):
        b = xclr(z, g, 0.1, tau_s)
        print(f"      xclr tau_s={tau_s:g}: {b:.12f} (supcon_out {a:.12f})")
    b = xclr(z, g, 0.1, 1e-4)
    _check(
        "(e) xclr(class graph, tau_s=1e-4) == supcon_out",
        abs(a - b) < 1e-9,
        f"{b:.12f} vs {a:.12f}",
    )
    # caption graph sanity: identical captions -> uniform targets; graph is symmetric with unit diagonal
    gc = xclr_caption_graph(rng.normal(size=(5, 3)), 2)
    _check(
        "(e') caption graph symmetric, diag 1",
        np.allclose(gc, gc.T) and np.allclose(np.diag(gc), 1.0),
        "ok",
    )

    # (f) CoNe with lambda_sup = lambda_dc = 0 == cross-entropy (with label smoothing)
    n, d, c, k_bank = 6, 5, 4, 10
    q, kk = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    logits = rng.normal(size=(n, c)) * 3
    y = rng.integers(0, c, size=n)
    bank = rng.normal(size=(k_bank, d))
    bank_labels = rng.integers(0, c, size=k_bank)
    raw = rng.uniform(size=(k_bank, c))
    bank_probs = raw / raw.sum(axis=1, keepdims=True)
    for ls in (0.0, 0.1):
        # independent CE: -(1-eps) log p_y - (eps/C) sum_c log p_c, with log p from np.log(softmax)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        want = float(
            np.mean(-(1 - ls) * np.log(p[np.arange(n), y]) - ls / c * np.log(p).sum(axis=1))
        )
        got = cone(q, kk, logits, y, bank, bank_labels, bank_probs, 0.0, 0.0, 0.1, 0.07, 3, ls)
        _check(
            f"(f) cone(lambda=0) == CE, label_smoothing={ls}",
            abs(got - want) < 1e-12,
            f"{got:.12f} vs {want:.12f}",
        )
    parts = cone_parts(q, kk, logits, y, bank, bank_labels, bank_probs, 0.7, 0.4, 0.1, 0.07, 3)
    total = cone(q, kk, logits, y, bank, bank_labels, bank_probs, 0.7, 0.4, 0.1, 0.07, 3)
    _check(
        "(f') cone total = ce + 0.7 in + 0.4 dc, parts >= 0",
        abs(total - (parts["ce"] + 0.7 * parts["sup_in"] + 0.4 * parts["dc"])) < 1e-12
        and parts["sup_in"] >= 0
        and parts["dc"] >= 0,
        str(parts),
    )
    empty = cone_parts(
        q,
        kk,
        logits,
        y,
        np.zeros((0, d)),
        np.zeros(0, int),
        np.zeros((0, c)),
        0.7,
        0.4,
        0.1,
        0.07,
        3,
    )
    _check(
        "(f'') cone with empty bank: sup_in = dc = 0",
        empty["sup_in"] == 0.0 and empty["dc"] == 0.0,
        str(empty),
    )

    # Extra: finiteness at tau = 1e-3 and no mutation of inputs
    z = rng.normal(size=(5, 2, 4))
    z_copy = z.copy()
    labels = np.array([0, 1, 0, 2, 1])
    vals = [
        infonce(z, 1e-3),
        supcon_out(z, labels, 1e-3),
        supcon_in(z, labels, 1e-3),
        sincere(z, labels, 1e-3, 0.1),
        xclr(z, xclr_class_graph(labels, np.eye(3), 2), 1e-3, 0.1),
        clip(z, rng.normal(size=(5, 4)), 1e-3),
        cone(
            z[:, 0],
            z[:, 1],
            logits[:5],
            y[:5],
            rng.normal(size=(k_bank, 4)),
            bank_labels,
            bank_probs,
            0.7,
            0.4,
            1e-3,
            1e-3,
            3,
        ),
    ]
    _check(
        "finite at tau=1e-3",
        all(math.isfinite(v) for v in vals),
        ", ".join(f"{v:.4g}" for v in vals),
    )
    _check("inputs not mutated", np.array_equal(z, z_copy), "ok")
    # no-positive cases: V=1 unique ids -> 0.0
    _check(
        "no positives -> 0.0",
        infonce(rng.normal(size=(4, 1, 3)), 0.1) == 0.0
        and supcon_out(rng.normal(size=(4, 1, 3)), np.arange(4), 0.1) == 0.0
        and sincere(rng.normal(size=(4, 1, 3)), np.arange(4), 0.1) == 0.0,
        "ok",
    )
    # CLIP with perfectly matched, orthogonal pairs at small tau -> ~0
    e = np.eye(4)
    got = clip(np.stack([e, e], axis=1), e, 0.01)
    _check("clip orthonormal matched pairs ~ 0", got < 1e-40, f"{got:.3e}")
    print("all self-checks passed")
