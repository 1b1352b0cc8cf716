"""Quire hubs: durable topic-based publish/subscribe on ledgers (Hedwig rebuilt).

    from hub.client import HedwigClient          # the client library
    # quire hub --conf conf/hw_server.conf       # one hub process (hub.server.HubServer)

Modules: ``conf`` (HubConf, HubClientConf), ``protocol`` (sans-IO wire state
machine), ``server`` (the asyncio shell), ``connection`` (one client
connection), ``topic`` (an owned topic), ``housekeeping`` (the timers), ``ownership`` (topic claims and
redirects), ``persistence`` (ledgers, batched entries, the read path),
``subscriptions`` and ``delivery``, consumers (``subscription_consumers``, ``cursor`` for acks,
``dispatch``/``dispatch_shared``/``dispatch_failover``/``dispatch_key_shared``; client side ``consumer``),
``metadata`` (MetaStore managers),
``readahead`` (the read-ahead cache), ``filters`` (message filters),
``message`` and ``errors``.
"""
