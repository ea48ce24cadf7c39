"""The catalog and its authorization: which actions exist, whether the operator signed
them, and what the connector publishes of them (the module report, ledger states)."""
