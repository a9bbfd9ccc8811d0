"""Make a throw-away CA for the egress gateway's tests and a configuration that trusts it.

    python tests/cluster/with_gateway_ca.py CONFIG CA_DIR OUT

CA_DIR gets ca.crt and ca.key (warren_common.pki); OUT is CONFIG with
services.gateway_trusted_ca set to the CA's certificate, so that the deployed gateway trusts
the HTTPS test hosts the conformance suite's gateway tests make (--gateway-test-ca CA_DIR).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from warren_common.pki import Pki


def main(config: Path, ca_dir: Path, out: Path) -> None:
    pki = Pki(ca_dir)
    pki.ensure_ca("ca", "Warren gateway test CA")
    data = yaml.safe_load(config.read_text()) or {}
    data.setdefault("services", {})["gateway_trusted_ca"] = pki.path("ca", "crt").read_text()
    out.write_text(yaml.safe_dump(data, sort_keys=False))


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:4]))
