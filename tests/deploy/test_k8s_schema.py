"""Every deploy/k8s overlay renders with `kubectl kustomize` and validates offline.

Core kinds are checked by kubernetes-validate (the Kubernetes OpenAPI schemas it bundles,
strict: an unknown field such as a misspelt `imagePullPolicy` is an error) against the
oldest and the newest Kubernetes version it bundles. The ServiceMonitor is a CRD of
prometheus-operator, outside those schemas: it is checked against the operator's own API
types (cloudcoil's models, generated from the operator's CRDs), strictly too - a field the
model does not know would be dropped on the round trip, and that fails the test.
Any other kind fails: nothing is skipped silently.
"""

from __future__ import annotations

import copy
import functools

import cloudcoil.models.prometheus_operator.v1 as prometheus_operator
import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from tests.deploy.manifests import overlays, rendered

CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
EXPECTED_OVERLAYS = {
    "single-pod/nvidia",
    "single-pod/amd",
    "single-pod/cpu",
    "fleet/nvidia",
    "fleet/amd",
    "fleet/cpu",
}
# The oldest and the newest Kubernetes release whose schemas the validator bundles.
VERSIONS = sorted({all_versions()[0], kubernetes_validate.latest_version()})


@pytest.fixture(scope="module", autouse=True)
def _schemas_read_once():
    """kubernetes-validate re-reads its 1.8 MB definitions file for every object; the
    files never change, so each is read once here (it about halves these tests' time)."""
    utils = kubernetes_validate.utils
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "schema_contents", functools.cache(utils.schema_contents))
        yield


def test_the_overlays_are_the_documented_ones():
    assert set(overlays()) == EXPECTED_OVERLAYS


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", overlays())
def test_every_object_validates_against_the_kubernetes_schema(overlay, version):
    docs = rendered(overlay)
    core = [d for d in docs if (d["apiVersion"], d["kind"]) not in CRD_KINDS]
    assert core, f"{overlay} rendered nothing"
    for doc in core:
        # Strict: additionalProperties are errors. A kind without a schema raises too.
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field():
    deployment = copy.deepcopy(
        next(d for d in rendered("single-pod/cpu") if d["kind"] == "Deployment")
    )
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def _service_monitor_model():
    # cloudcoil-models-prometheus-operator (test extra) checks the ServiceMonitor
    return prometheus_operator.ServiceMonitor


def _strict_round_trip(doc: dict) -> dict:
    """The document as prometheus-operator's types read it: validated, then dumped."""
    model = _service_monitor_model()
    return model.model_validate(doc).model_dump(by_alias=True, exclude_none=True, mode="json")


@pytest.mark.parametrize("overlay", [o for o in overlays() if not o.endswith("/cpu")])
def test_the_service_monitor_is_a_valid_prometheus_operator_object(overlay):
    docs = [d for d in rendered(overlay) if (d["apiVersion"], d["kind"]) in CRD_KINDS]
    assert len(docs) == 1
    assert _strict_round_trip(docs[0]) == docs[0]


def test_the_service_monitor_check_catches_unknown_fields_and_values():
    doc = next(d for d in rendered("single-pod/nvidia") if d["kind"] == "ServiceMonitor")
    misspelt = copy.deepcopy(doc)
    misspelt["spec"]["endpoints"][0]["scrapeInterval"] = "30s"
    assert _strict_round_trip(misspelt) != misspelt
    wrong = copy.deepcopy(doc)
    wrong["spec"]["endpoints"][0]["authorization"]["credentials"] = "a-key"
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        _strict_round_trip(wrong)
