"""The byte-level corpus: GCIDE (scripts/fetch_gcide.sh) as a uint8 token tensor, its train / held-out
split, the random training batches and the fixed held-out windows.

Tokens are raw bytes (vocabulary 256), so no tokenizer travels with a checkpoint.
"""

import gzip

import torch

VOCAB_SIZE = 256


def load_tokens(path):
    """Reads a gzip (or dictzip, which is gzip-compatible) file into a 1-D uint8 CPU tensor of its bytes."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if not raw:
        raise ValueError(f"{path}: empty corpus")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def split_heldout(tokens, heldout_frac=0.02):
    """Returns (train, heldout): the last `heldout_frac` of the bytes are held out.

    A contiguous tail rather than scattered pieces: no training window can overlap a held-out one, and
    the split depends only on the file. GCIDE is alphabetical, so the held-out part is the end of the
    alphabet (W-Z): a mild shift of topic, the same style of text.
    """
    if not 0.0 < heldout_frac < 1.0:
        raise ValueError(f"heldout_frac must be in (0, 1), got {heldout_frac}")
    n_heldout = max(1, int(tokens.numel() * heldout_frac))
    return tokens[:-n_heldout], tokens[-n_heldout:]


class BatchSampler:
    """Random (inputs, targets) batches of shape [batch, seq] (int64) from one split: windows of seq + 1
    bytes at uniform random starts, targets being the next byte of each input position.

    The split lives on `device` as uint8 so that a batch is one gather, with no host-to-device copy per
    step; the generator is seeded so that runs are reproducible on a given device.
    """

    def __init__(self, tokens, batch, seq, device, seed=0):
        if tokens.numel() < seq + 1:
            raise ValueError(f"split of {tokens.numel()} bytes is shorter than a window of {seq + 1}")
        self.tokens = tokens.to(device)
        self.batch = batch
        self.seq = seq
        self.window = torch.arange(seq + 1, device=device)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def sample(self):
        high = self.tokens.numel() - self.seq  # exclusive: the last start whose window fits
        starts = torch.randint(0, high, (self.batch,), generator=self.generator, device=self.tokens.device)
        windows = self.tokens[starts[:, None] + self.window].long()
        return windows[:, :-1], windows[:, 1:]


def heldout_windows(tokens, count, seq):
    """The fixed evaluation set: `count` windows of seq + 1 bytes at evenly spaced starts over the split,
    as (inputs, targets) int64 [count, seq] on the split's device. Windows overlap when the split is
    shorter than count * (seq + 1) bytes; every run of the same checkpoint sees the same windows.
    """
    if tokens.numel() < seq + 1:
        raise ValueError(f"held-out split of {tokens.numel()} bytes is shorter than a window of {seq + 1}")
    last_start = tokens.numel() - seq - 1
    starts = torch.linspace(0, last_start, count, dtype=torch.float64).round().long().to(tokens.device)
    windows = tokens[starts[:, None] + torch.arange(seq + 1, device=tokens.device)].long()
    return windows[:, :-1], windows[:, 1:]
