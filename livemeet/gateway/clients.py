"""Who a live session belongs to: the client the per-client cap on live sessions counts it
against (`serve --max-live-sessions-per-client`; docs/protocol.md, "Sessions per client"), and
whose API key it runs on, so that a key revoked while it runs ends it (docs/protocol.md, "API
keys"). Sans-I/O policy: ws_live.py and live_sessions.py apply it.

A session belongs to the client of the connection that opened it, or that last resumed it (a
resume presents a valid key of its own, and the session runs on that key from then on; it is
never refused for the cap). The client
is its API key where the server asked for one; else its address (`request.remote`), an IPv6
one by its /64 (IPV6_CLIENT_PREFIX_BITS: a host may take any address of its subnet), an
IPv4-mapped IPv6 one as the IPv4 address. A client without a key on a loopback address is not
capped by address: that is most often a reverse proxy on this machine, through which every
client has the same address (the server's own advice for an open server is to listen on
127.0.0.1 behind an authenticating proxy); nor is one whose address is unknown.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from livemeet.audio.constants import IPV6_CLIENT_PREFIX_BITS
from livemeet.errors import TooManySessions

CAP_FLAG = "--max-live-sessions-per-client"


@dataclass(frozen=True)
class Client:
    """One client: an API key (`key_id`, its public id), or, where no key was asked for, an
    address (`address`: an IPv4 address, or an IPv6 /64 network)."""

    key_id: str | None = None
    address: str | None = None

    def __str__(self) -> str:
        return f"API key {self.key_id}" if self.key_id is not None else f"address {self.address}"


def client_of(key_id: str | None, remote: str | None) -> Client | None:
    """The client of a connection let in with the key `key_id` (None: none was needed) from
    the address `remote` (None: unknown); None for a client not capped (module docstring)."""
    if key_id is not None:
        return Client(key_id=key_id)
    if not remote:
        return None
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:  # not an IP address: nothing to tell clients apart by
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        # the address without its zone (fe80::1%eth0): ip_network refuses one
        bare = ipaddress.IPv6Address(int(address))
        subnet = ipaddress.IPv6Network((bare, IPV6_CLIENT_PREFIX_BITS), strict=False)
        return Client(address=str(subnet))
    return Client(address=str(address))


def cap_refusal(client: Client, held: int, cap: int) -> TooManySessions | None:
    """The refusal of a new live session for `client`, which holds `held` running sessions
    (detached ones and those it is opening included), under a cap of `cap` sessions a client
    (0: no cap); None where it may open one."""
    if cap <= 0 or held < cap:
        return None
    sessions = f"{held} live session{'' if held == 1 else 's'}"
    return TooManySessions(
        f"this client ({client}) holds {sessions}, the most one client may ({CAP_FLAG} "
        f"{cap}): end one first (a detached one counts until it is resumed and ended, or its "
        "resume window runs out), then retry"
    )
