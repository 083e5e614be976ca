"""Integrations with other systems. Each sub-package needs that system installed; importing
``fairpool`` never imports them."""
