"""config: what a node offers and what a claim may ask (the node configuration, its
loader, claim parameters, caps, class names). Pure except the file loader.
May import: model."""
