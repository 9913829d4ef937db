"""Which host holds which participants: the executor's bookkeeping, never a call to a host.

`Membership` maps a host's name to its participants in the hosts' order (as the layout made
them, less the hosts lost for good) and answers the round loop's look-ups over it; its
indexes are rebuilt only when the hosts change.
"""

from __future__ import annotations

from raymtl.algorithms.base import role_of


class Membership(dict[str, tuple[str, ...]]):
    """Host name -> the participants it holds, with the look-ups the round loop makes."""

    def participants(self) -> list[str]:
        """Every participant the hosts hold now."""
        return [p for members in self.values() for p in members]

    def client_hosts(self) -> list[str]:
        """The hosts of clients, in the hosts' order."""
        return [name for name, members in self.items() if role_of(members[0]) == "client"]

    def host_of(self) -> dict[str, str]:
        """Participant -> the host holding it now."""
        return self._index()[1]

    def participants_of(self, role: str) -> list[str]:
        """The participants of `role` the hosts hold now, in the hosts' order."""
        return self._index()[2].get(role, [])

    def holds(self, participant: str) -> bool:
        """Whether a host holds `participant` now (a lost host's do not count)."""
        return participant in self._index()[0]

    def order_of(self, participant: str) -> int:
        """`participant`'s place among `participants()` (the hosts' order)."""
        position = self._index()[0]
        return position.get(participant, len(position))

    def _index(self) -> tuple[dict[str, int], dict[str, str], dict[str, list[str]]]:
        """Participant -> its place, participant -> its host, role -> its participants;
        rebuilt when the hosts change."""
        layout = tuple((name, id(members)) for name, members in self.items())
        if getattr(self, "_layout", None) != layout:
            position = {p: k for k, p in enumerate(self.participants())}
            host = {p: name for name, members in self.items() for p in members}
            of_role: dict[str, list[str]] = {}
            for participant in position:
                of_role.setdefault(role_of(participant), []).append(participant)
            self._layout, self._indexes = layout, (position, host, of_role)
        return self._indexes
