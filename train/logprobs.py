"""The log-probabilities of a collated batch's label tokens under a model: what every training loss starts from.

Each token's log-probability is taken from the logits in float32 (``log_softmax`` gathered at the label
positions, shifted by one as HF does); only the positions that predict a label get logits at all
(``logits_to_keep`` with a boolean mask), which keeps a 150k-word vocabulary affordable. Vision placeholders are
left out of a row's distribution as its recording left them out (the batch's ``logprobs_vision_masked``: the
``hf`` backend's sampler suppresses them; vLLM's log-probs include them); a batch without that key leaves them
out of every row.

A temperature divides the logits before the log-softmax (``log_softmax(logits / T)``, as verl's actor does):
GRPO takes each row at the temperature its behaviour log-probs were recorded at
(:attr:`train.samples.Sample.logprobs_temperature`, the batch's ``logprobs_temperature``), so that
``logp_theta``, ``logp_prox`` and ``logp_behave`` are under one distribution; FBC's NLL stays at 1.
"""

from __future__ import annotations

from typing import Any

from policy.vision_tokens import vision_token_ids
from train.model_inputs import IGNORE_INDEX

#: The batch keys a Qwen-VL forward takes.
_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "pixel_values", "image_grid_thw", "mm_token_type_ids")


def model_inputs(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """The forward's inputs of a collated batch, on ``device``."""
    return {k: batch[k].to(device, non_blocking=True) for k in _INPUT_KEYS if k in batch}


def _row_scale(temperature: Any, rows: Any, logits: Any) -> Any:
    """The divisor of each kept position's logits: None (temperature 1 everywhere), a float, or ``(N, 1)``."""
    import torch

    if temperature is None:
        return None
    if isinstance(temperature, (int, float)):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, not {temperature}")
        return None if temperature == 1 else float(temperature)
    per_row = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    if per_row.dim() != 1:
        raise ValueError(f"temperature: one per batch row expected, got shape {tuple(per_row.shape)}")
    if not bool((per_row > 0).all()):
        raise ValueError(f"temperature must be > 0 in every row, got {per_row.tolist()}")
    if bool((per_row == 1).all()):
        return None
    return per_row[rows.to(logits.device)].unsqueeze(-1)


def label_logprobs(model: Any, batch: dict[str, Any], device: Any,
                   temperature: float | Any | None = None) -> tuple[Any, Any, Any, Any]:
    """Log-probabilities of the label tokens under ``model``, flattened in row-major order of the labels.

    Returns ``(logp, targets, rows, logits)``: ``(N,)`` each with ``N`` the batch's label tokens (the float32
    log-prob of each label, the label ids, the batch row of each: its sample, also in a packed batch,
    :mod:`train.packing`) and the ``(N, vocab)`` float32 logits (as the
    model gave them: no temperature). Position ``t - 1`` predicts ``labels[:, t]`` (HF's shift); only those
    positions are projected onto the vocabulary (``logits_to_keep`` as a boolean mask).

    ``temperature``: None or 1 for ``log_softmax(logits)``; a positive number for ``log_softmax(logits / T)``
    in every row; a ``(B,)`` tensor (the batch's ``logprobs_temperature``) for one ``T`` per row.
    """
    import torch

    labels = batch["labels"].to(device)
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX  # positions whose next token is a label
    targets = labels[:, 1:][keep[:, :-1]]
    if "sample_index" in batch:  # a packed batch (train.packing): the sample of each token
        rows = batch["sample_index"].to(device)[keep]
    else:
        rows = torch.arange(labels.shape[0], device=device).unsqueeze(1).expand_as(labels)[keep]
    inputs = model_inputs(batch, device)
    try:
        logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    except (IndexError, TypeError):
        # transformers before 5.2x takes only an int: project the kept positions' hidden states ourselves
        # rather than materialising the logits of every position (batch x length x vocabulary).
        hidden = model.model(**inputs, use_cache=False).last_hidden_state
        logits = model.lm_head(hidden[keep])
    if logits.dim() == 3 and logits.shape[:2] == labels.shape:  # a transformers that ignored the mask
        logits = logits[keep]
    logits = logits.reshape(-1, logits.shape[-1]).float()
    if logits.shape[0] != targets.shape[0]:
        raise RuntimeError(f"{logits.shape[0]} logits for {targets.shape[0]} labels")
    # Each row's distribution leaves the vision placeholders out where its recording did (the hf backend's, and
    # the default); vLLM's and SGLang's are over the whole vocabulary.
    vision = torch.tensor(vision_token_ids(model.config), dtype=torch.long, device=logits.device)
    per_row = batch.get("logprobs_vision_masked")
    leave_out = (per_row.to(logits.device)[rows] if per_row is not None
                 else torch.ones_like(rows, dtype=torch.bool)).unsqueeze(-1)
    masked = logits.clone()  # only the placeholders' columns change: (labels, placeholders), not (labels, vocabulary)
    masked[:, vision] = logits[:, vision].masked_fill(leave_out, float("-inf"))
    scale = _row_scale(temperature, rows, logits)
    if scale is not None:
        masked = masked / scale  # -inf stays -inf
    logp = torch.log_softmax(masked, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, targets, rows, logits
