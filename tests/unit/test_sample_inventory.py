"""inventories/sample holds together: Warren's services as workloads on external stores that
are the inventory's own host stores, at the addresses those listen on, and nothing secret in
what is rendered for it."""

from __future__ import annotations

from pathlib import Path

import yaml
from test_bundle_images import DIGESTS, container_images, extracted_bundle

from warren.bundle.images import WORKLOAD_IMAGES
from warren.bundle.workloads import for_bundle
from warren.config import load_config
from warren.render import render

SAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "sample"


def test_the_sample_runs_workloads_on_its_host_stores() -> None:
    config = load_config(SAMPLE / "warren.yaml")
    assert config.services.enabled and config.services.stores == "external"
    group_vars = yaml.safe_load((SAMPLE / "group_vars" / "all.yml").read_text())
    store = f"http://{group_vars['object_store_listen_address']}:{group_vars['object_store_base_port'] + 3}"
    assert config.services.object_store_endpoint == store
    # The database's URL names an address it listens on, which is not loopback (pods reach it).
    assert group_vars["postgres_url_host"] in group_vars["postgres_listen_addresses"]
    assert group_vars["postgres_url_host"] not in ("127.0.0.1", "localhost", "::1")
    assert group_vars["admission_bundle"] == group_vars["service_images_bundle_dir"]


def test_what_is_rendered_for_the_sample_is_pinned_and_holds_no_secret(tmp_path: Path) -> None:
    objects = render(for_bundle(load_config(SAMPLE / "warren.yaml"), extracted_bundle(tmp_path)))
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert container_images(objects) == {
        f"warren.dev/{n}:0.1.0@{DIGESTS[n]}" for n in WORKLOAD_IMAGES["external"]
    }
