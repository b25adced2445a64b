"""Checking a network before anything is written or sent: pure code.

``create_network`` raises :class:`ValidationError` naming the field (``name``, ``subnet``,
``gateway``, ``mac_prefix``, ``mode``, ``link``, ``groups``) for what Ganeti would refuse,
so that a cloud API answers 400 at once instead of a job failing on one backend after
the network was made on another. The rules are Ganeti 3.0's:

* ``subnet``: an IPv4 network with no host bits set, from /16 to /30
  (``network.AddressPool.__init__``: ``ipaddress.ip_network``, ``IPV4_NETWORK_MIN_SIZE``
  and ``IPV4_NETWORK_MAX_SIZE``);
* ``gateway``: an IPv4 address inside the subnet, neither its network nor its broadcast
  address (``LUNetworkAdd.CheckPrereq`` reserves it; those two are reserved already);
* ``mac_prefix``: three colon-separated hex octets, normalised to lower case
  (``utils.NormalizeAndValidateThreeOctetMacPrefix``);
* ``mode``: bridged, routed, openvswitch or pool (``constants.NIC_VALID_MODES``, and
  the RAPI client's ``NETWORK_MODES``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from synnefo_ganeti.errors import ValidationError
from synnefo_ganeti.rapi._calls import NETWORK_MODES

__all__ = ["NetworkRequest", "check_network", "groups_for"]

#: a network name: what a Ganeti name and a URL path segment both take
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAC_PREFIX = re.compile(r"^[0-9a-f]{2}:[0-9a-f]{2}:[0-9a-f]{2}$")
_LINK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
#: Ganeti's IPV4_NETWORK_MIN_SIZE and IPV4_NETWORK_MAX_SIZE (prefix lengths)
_SMALLEST, _LARGEST = 30, 16

Groups = Sequence[str] | Mapping[str, Sequence[str]] | None


@dataclass(frozen=True, slots=True)
class NetworkRequest:
    """A network as checked: the values that are written and sent (normalised)."""

    name: str
    subnet: str
    gateway: str | None
    mac_prefix: str | None
    mode: str
    link: str | None


def _subnet(subnet: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(str(subnet))
    except ValueError as exc:
        raise ValidationError(
            f"subnet {subnet!r} is not an IPv4 network ({exc}); give one like 10.0.0.0/24, host bits zero",
            field="subnet",
        ) from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise ValidationError(
            f"subnet {subnet!r} is not IPv4; Ganeti's address pools are IPv4 (like 10.0.0.0/24)",
            field="subnet",
        )
    if not _LARGEST <= net.prefixlen <= _SMALLEST:
        raise ValidationError(
            f"subnet {subnet} is a /{net.prefixlen}; Ganeti takes networks from /{_LARGEST} to /{_SMALLEST}",
            field="subnet",
        )
    return net


def _gateway(gateway: str, net: ipaddress.IPv4Network) -> str:
    try:
        address = ipaddress.ip_address(str(gateway))
    except ValueError:
        raise ValidationError(
            f"gateway {gateway!r} is not an IPv4 address; give one inside {net}", field="gateway"
        ) from None
    if not isinstance(address, ipaddress.IPv4Address) or address not in net:
        raise ValidationError(
            f"gateway {gateway} is not inside subnet {net}; give one inside it", field="gateway"
        )
    if address in (net.network_address, net.broadcast_address):
        raise ValidationError(
            f"gateway {gateway} is the network or broadcast address of {net}; give a host address",
            field="gateway",
        )
    return str(address)


def check_network(
    name: str,
    *,
    subnet: str,
    gateway: str | None,
    mac_prefix: str | None,
    mode: str,
    link: str | None,
) -> NetworkRequest:
    """The request, normalised; :class:`ValidationError` naming the first field Ganeti would refuse."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValidationError(
            f"network name {name!r} is not valid: 1 to 128 of letters, digits, '.', '_' and '-', "
            "starting with a letter or a digit",
            field="name",
        )
    net = _subnet(subnet)
    checked_gateway = None if gateway is None else _gateway(gateway, net)
    checked_prefix = None
    if mac_prefix is not None:
        checked_prefix = str(mac_prefix).lower()
        if not _MAC_PREFIX.match(checked_prefix):
            raise ValidationError(
                f"MAC prefix {mac_prefix!r} is not three hex octets; give one like aa:00:01",
                field="mac_prefix",
            )
    if mode not in NETWORK_MODES:
        raise ValidationError(
            f"network mode {mode!r} is not one of {', '.join(sorted(NETWORK_MODES))}", field="mode"
        )
    if link is not None and not _LINK.match(str(link)):
        raise ValidationError(
            f"link {link!r} is not a bridge, switch or routing table name (letters, digits, '.', '_', ':', '-')",
            field="link",
        )
    return NetworkRequest(name, str(net), checked_gateway, checked_prefix, mode, link)


def groups_for(groups: Groups, backends: Sequence[str]) -> dict[str, list[str] | None]:
    """The node groups to connect on each backend (None: every group it has).

    ``groups`` is None (every group everywhere), a list of group names (the same on every
    backend) or a mapping backend -> names (a backend it leaves out: every group)."""
    if groups is None:
        return dict.fromkeys(backends)
    if isinstance(groups, str):
        raise ValidationError(
            f"groups must be a list of group names, not the string {groups!r}", field="groups"
        )
    if isinstance(groups, Mapping):
        unknown = sorted(set(groups) - set(backends))
        if unknown:
            raise ValidationError(
                f"groups names backends the network is not created on: {', '.join(unknown)}", field="groups"
            )
        return {b: _names(groups[b]) if b in groups else None for b in backends}
    return dict.fromkeys(backends, _names(groups))


def _names(names: Sequence[str]) -> list[str]:
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ValidationError(f"groups must be lists of group names, not {names!r}", field="groups")
    if not names:
        raise ValidationError("groups names no group; leave it out to connect every group", field="groups")
    return list(dict.fromkeys(names))
