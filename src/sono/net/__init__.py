"""The sandbox's network: a policy, a host-side egress proxy, a model gateway that holds the
real API keys, and the in-sandbox TCP → Unix socket forwarder.

The sandbox itself has no network. It reaches the outside only through Unix sockets bound
into it: :mod:`sono.net.proxy` (HTTP ``CONNECT`` and absolute-form requests, checked
against a :class:`sono.net.policy.NetworkPolicy`) and :mod:`sono.net.gateway` (model API
requests, with the placeholder key swapped for the real one and token usage recorded).
:mod:`sono.net.forward` runs inside the sandbox and exposes those sockets on 127.0.0.1
for tools that only speak TCP (``HTTPS_PROXY``, ``ANTHROPIC_BASE_URL``).
"""

from __future__ import annotations
