"""model: the records and vocabulary every layer speaks (errors, identifiers, quantities,
GPUs, published devices, claim plans, CDI content). Pure: no I/O.
May import: nothing of the project outside this folder."""
