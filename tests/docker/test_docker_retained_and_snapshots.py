"""docker tier: what outlives a claim, listed and removed through the claims API on a real engine: a sandbox retained
by its claim (shutdownPolicy Retain) is listed after the release (and after an operator restart), deleted, and its
container is gone; a snapshot image is listed, refused while a sandbox uses it, removed (by reference or ID) and gone;
unknown names are 404, and neither route touches what is not its own (a pool's sandbox, a template's image)."""

from __future__ import annotations

import httpx
import pytest

from corral.operator.docker import engine

pytestmark = pytest.mark.docker


def run(http: httpx.Client, claim: str, command: str) -> dict:
    r = http.post(f"/v1/claims/{claim}/execd/v1/command", json={"command": command})
    assert r.status_code == 200, r.text
    return r.json()


def is_error(r: httpx.Response, status: int, code: str) -> bool:
    return r.status_code == status and set(r.json()) == {"code", "message"} and r.json()["code"] == code


def test_a_retained_sandbox_is_listed_after_release_and_deleted_with_its_container(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    with op.http() as http:
        assert http.get("/v1/retained").json() == {"items": []}
        c = http.post("/v1/claims", json={"pool": "shell", "name": "keeper", "shutdownPolicy": "Retain"}).json()
        assert c["phase"] == "Ready", c
        kept = c["sandbox"]["name"]
        run(http, "keeper", "echo work > /tmp/result")
        assert http.get("/v1/retained").json() == {"items": []}  # still claimed: not retained yet
        assert http.delete("/v1/claims/keeper").status_code == 204
        assert op.containers(**{"corral.dev/sandbox": kept})[0].status == "running"  # the claim is gone, not it

        items = http.get("/v1/retained").json()["items"]
        assert [(r["name"], r["claim"], r["pool"], r["template"], r["state"], r["ready"]) for r in items] == [
            (kept, "keeper", "shell", "shell", "running", True)]
        assert items[0]["retainedAt"] >= c["created"] and items[0]["created"] <= items[0]["retainedAt"]
        op.wait_idle("shell", 1)  # the pool refills: the retained sandbox is no member of it

        op.stop()  # the record is the operator's store: it survives a restart
        op.start()
        assert [r["name"] for r in http.get("/v1/retained").json()["items"]] == [kept]

        idle = [x.name for x in op.containers(**{"corral.dev/pool": "shell"}) if x.name != kept]
        assert idle
        assert is_error(http.delete(f"/v1/retained/{idle[0]}"), 404, "not_found")  # a pool's sandbox: not here
        assert is_error(http.delete("/v1/retained/no-such-sandbox"), 404, "not_found")
        assert is_error(http.delete("/v1/retained/Not_A_Name"), 400, "invalid")
        assert op.containers(**{"corral.dev/sandbox": idle[0]})

        assert http.delete(f"/v1/retained/{kept}").status_code == 204
        assert not op.containers(**{"corral.dev/sandbox": kept})
        assert http.get("/v1/retained").json() == {"items": []}
        assert is_error(http.delete(f"/v1/retained/{kept}"), 404, "not_found")
        assert op.containers(**{"corral.dev/sandbox": idle[0]})  # the pool's sandbox is untouched


def test_a_snapshot_is_listed_refused_while_in_use_and_removed_with_its_image(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    template_image = op.desired.template("shell").image
    with op.http() as http:
        assert http.get("/v1/snapshots").json() == {"items": []}
        assert http.post("/v1/claims", json={"pool": "shell", "name": "src"}).json()["phase"] == "Ready"
        run(http, "src", "echo saved > /tmp/saved")
        made = http.post("/v1/claims/src/snapshot", json={"tag": "src-1"})
        assert made.status_code == 200, made.text
        snap = made.json()
        ref = f"corral-snapshot/{op.stack}:src-1"
        assert snap["image"] == ref and snap["claim"] == "src" and snap["size"] > 0 and snap["created"]

        listed = http.get("/v1/snapshots").json()["items"]
        assert listed == [snap]  # the listing says what the snapshot call said
        assert listed[0]["size"] == op.client.images.get(ref).attrs["Size"]

        # A sandbox started from it holds it: refused, named, and the image stays.
        user = http.post("/v1/claims", json={"pool": "shell", "name": "user", "snapshot": ref}).json()
        assert user["phase"] == "Ready", user
        busy = http.delete(f"/v1/snapshots/{ref}")
        assert is_error(busy, 409, "conflict") and user["sandbox"]["name"] in busy.json()["message"]
        assert engine.image_exists(op.client, ref)
        assert http.delete("/v1/claims/user").status_code == 204

        # Not this route's to remove: a template's image, an unknown one; and a malformed reference.
        assert is_error(http.delete(f"/v1/snapshots/{template_image}"), 404, "not_found")
        assert engine.image_exists(op.client, template_image)
        assert is_error(http.delete("/v1/snapshots/no-such-image:1"), 404, "not_found")
        assert is_error(http.delete("/v1/snapshots/Not A Ref"), 400, "invalid")

        assert http.delete(f"/v1/snapshots/{ref}").status_code == 204
        assert not engine.image_exists(op.client, ref)
        assert http.get("/v1/snapshots").json() == {"items": []}
        assert is_error(http.delete(f"/v1/snapshots/{ref}"), 404, "not_found")

        # By image ID too (what `docker images` shows).
        second = http.post("/v1/claims/src/snapshot", json={"tag": "src-2"}).json()
        assert http.delete(f"/v1/snapshots/{second['id']}").status_code == 204
        assert not engine.image_exists(op.client, second["image"])
        assert http.get("/v1/snapshots").json() == {"items": []}
