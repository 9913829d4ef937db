"""What a client's host does to the models its clients send up, and what the aggregator's host
undoes before its step sees them (docs/ALGORITHMS.md §9.3-9.5), so that no algorithm knows:

    client's host, after the step, for each message of `Algorithm.uplink_kinds` to a server
    or LPS:   Δ_k = x_k − r_k            r_k: what the client started from (below)
              Δ_k ← attack(Δ_k)          a malicious client's transform (§9.5)
              Δ_k ← clip(Δ_k) (+ noise)  privacy.noise client (clip) or local (clip + noise)
              payload ← C(Δ_k + e_k)     compression with error feedback (§9.4); the ledger
                                         counts the encoded bits
    aggregator's host, before the step:  x̂_k = r_k + decode(payload)

r_k, the reference, is per tensor the one of the same name in the client's inbox of this step
(the global model of a star round), else the client's own model before the step (a
hierarchical client's, which its LPS sent it last round). The envelope carries r_k's payload
handle beside the update, uncounted: the aggregator knows what it sent. Error-feedback
residuals e_k are the client's kept state (`State.extras[RESIDUAL]`: checkpointed, spilled).
Every draw (attack noise, local noise, QSGD's rounding) comes from the seeded stream
derive_seed(seed, round, client, "uplink"): inline equals Ray, and a resume the run.
"""

from __future__ import annotations

import torch

from raymtl.algorithms.base import Message, role_of
from raymtl.algorithms.training import derive_seed
from raymtl.toolbox.settings import Toolbox

RESIDUAL = "uplink_residual"  # the client's error-feedback residual, in its extras

Tensors = dict[str, torch.Tensor]


class Uplink:
    """The uplink transforms of one host's clients (see the module)."""

    def __init__(self, toolbox: Toolbox, uplink_kinds: tuple[str, ...], malicious: frozenset):
        self.toolbox, self.kinds, self.malicious = toolbox, tuple(uplink_kinds), malicious
        attack, privacy = toolbox.attack, toolbox.privacy
        self.attacks = not attack.is_default() and attack.kind != "label_flip"
        self.clips = privacy.client_level and privacy.noise in ("client", "local")
        self.codec = toolbox.compression.uplink
        self.active = self.attacks or self.clips or self.codec is not None

    @property
    def keeps_residual(self) -> bool:
        """Clients keep an error-feedback residual between rounds."""
        return self.codec is not None and self.codec.error_feedback

    def applies(self, message: Message) -> bool:
        return (
            self.active
            and message.kind in self.kinds
            and role_of(message.dst) in ("server", "lps")
            and role_of(message.src) == "client"
        )

    def transform(
        self,
        message: Message,
        reference: Tensors,
        extras: dict,
        seed: int,
        round_index: int,
    ) -> tuple[Tensors, int | None]:
        """The tensors that go on the wire for `message` and their bits (None: plain tensors,
        counted as they are): an attacked, clipped, noised and encoded update."""
        from raymtl.toolbox.attacks import attack_update
        from raymtl.toolbox.compression import compress
        from raymtl.toolbox.privacy import clip_update, gaussian_noise_like

        client = int(message.src.split("/")[1])
        generator = torch.Generator().manual_seed(
            derive_seed(seed, round_index, message.src, "uplink", message.kind)
        )
        sent = message.tensors
        floats = [n for n, t in sent.items() if t.is_floating_point() and n in reference]
        delta = {name: sent[name] - reference[name].to(sent[name].device) for name in floats}
        if self.attacks and client in self.malicious:
            attack = self.toolbox.attack
            delta = attack_update(attack.kind, delta, attack.strength, generator)
        privacy = self.toolbox.privacy
        if self.clips:
            delta, _ = clip_update(delta, privacy.clip)
            if privacy.noise == "local":
                noise = gaussian_noise_like(
                    delta, privacy.noise_multiplier * privacy.clip, generator
                )
                delta = {name: value + noise[name] for name, value in delta.items()}
        if self.codec is None:
            return {**sent, **{n: reference[n].to(d.device) + d for n, d in delta.items()}}, None
        residual = extras.get(residual_key(message.kind)) if self.keeps_residual else None
        payload, bits, residual = compress(self.codec, delta, residual, generator)
        if self.keeps_residual:
            extras[residual_key(message.kind)] = {n: t.detach().cpu() for n, t in residual.items()}
        # Tensors the codec does not take (not floating, or nothing to encode them against)
        # travel as they are, and count as they are.
        plain = {name: t for name, t in sent.items() if name not in delta}
        bits += sum(t.numel() * t.element_size() * 8 for t in plain.values())
        return {**{f"{PLAIN}{n}": t for n, t in plain.items()}, **payload}, bits

    def decode(self, encoded: Tensors, reference: Tensors) -> Tensors:
        """x̂_k = r_k + decode(payload), and the plain tensors as they came."""
        from raymtl.toolbox.compression import decode

        plain = {n[len(PLAIN) :]: t for n, t in encoded.items() if n.startswith(PLAIN)}
        payload = {n: t for n, t in encoded.items() if not n.startswith(PLAIN)}
        delta = decode(self.codec, payload)
        decoded = {name: reference[name] + d.to(reference[name].dtype) for name, d in delta.items()}
        return {**decoded, **plain}


PLAIN = "plain:"  # prefix of the tensors an encoded payload carries unencoded


def residual_key(kind: str) -> str:
    return f"{RESIDUAL}/{kind}"


def reference_of(names, inbox: list[Message], before: Tensors | None) -> tuple[Tensors, int | None]:
    """r_k (see the module) for the tensors `names`, and the index of the inbox message that
    holds all of them, when one does (its payload is then the reference's, stored once)."""
    for index in range(len(inbox) - 1, -1, -1):
        tensors = inbox[index].tensors
        if all(name in tensors for name in names):
            return tensors, index
    received: Tensors = dict(before or {})
    for message in inbox:
        received.update(message.tensors)
    return received, None
