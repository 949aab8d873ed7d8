"""The console's access rules through its HTTP surface (Starlette's TestClient, the fake
data): hashed secrets, sign-in, CSRF on every form, no anonymous write, read-only mode."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tests.console_fake import FakeData, gate, workflow
from vibey.console.app import create_app
from vibey.console.auth import Access, hash_secret, verify_secret
from vibey.settings import ConsoleSettings, SettingsError, load_settings, replace

PASSWORD = "correct horse"
TOKEN = "a-token-for-scripts"
PASSWORD_HASH, TOKEN_HASH = hash_secret(PASSWORD), hash_secret(TOKEN)
SIGNED = ConsoleSettings(password_hash=PASSWORD_HASH, token_hash=TOKEN_HASH)


def client_for(settings: ConsoleSettings, data: FakeData) -> TestClient:
    return TestClient(create_app(settings=settings, data=data), follow_redirects=False)


@pytest.fixture
def data() -> FakeData:
    fake = FakeData()
    fake.add(gate())
    return fake


@pytest.fixture
def web(data: FakeData) -> Iterator[TestClient]:
    with client_for(SIGNED, data) as client:
        yield client


def csrf_of(client: TestClient, path: str = "/login") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(path).text)
    assert found is not None, "the page has a form with a CSRF token"
    return found.group(1)


def sign_in(client: TestClient, username: str = "admin", password: str = PASSWORD) -> int:
    answer = client.post(
        "/login",
        data={"username": username, "password": password, "csrf": csrf_of(client)},
    )
    return answer.status_code


def only_gate(data: FakeData) -> str:
    (gate_id,) = data.open
    return str(gate_id)


# -- hashes ------------------------------------------------------------------------------------


def test_a_hash_verifies_its_secret_only() -> None:
    encoded = hash_secret("s3cret")
    assert encoded.startswith("scrypt$16384$8$1$") and "s3cret" not in encoded
    assert verify_secret("s3cret", encoded)
    assert not verify_secret("s3cret ", encoded)
    assert hash_secret("s3cret") != encoded  # salted


@pytest.mark.parametrize("bad", ["", "scrypt$1$2", "pbkdf2$1$1$1$aa$bb", "scrypt$x$8$1$aa$bb"])
def test_a_malformed_hash_verifies_nothing(bad: str) -> None:
    assert not verify_secret("anything", bad)


# -- reading -----------------------------------------------------------------------------------


def test_an_anonymous_reader_is_sent_to_sign_in(web: TestClient) -> None:
    for path in ("/", "/gates", "/health"):
        answer = web.get(path)
        assert answer.status_code == 303 and answer.headers["location"] == f"/login?next={path}"
    assert web.get("/events").status_code == 401
    assert web.get("/healthz").text == "ok"


def test_a_wrong_password_signs_no_one_in(web: TestClient) -> None:
    assert sign_in(web, password="wrong") == 401
    assert sign_in(web, username="root") == 401
    assert web.get("/gates").status_code == 303


def test_every_page_renders_for_a_signed_in_person(web: TestClient, data: FakeData) -> None:
    entered = ("design", "build", "review", "build", "review")
    run = data.add_workflow(workflow("acme", "review", 1), entered).summary.workflow
    sign_in(web)
    for path in ("/", "/gates", "/health", f"/workflows/{run.id}"):
        page = web.get(path)
        assert page.status_code == 200 and 'data-marker="' in page.text, path
    overview = web.get("/").text
    assert '<tr data-project="acme">' in overview and 'class="phases"' in overview
    assert 'data-phase="review" data-current="true"' in web.get(f"/workflows/{run.id}").text
    assert web.get("/workflows/00000000-0000-0000-0000-000000000000").status_code == 404


def test_a_signed_in_person_sees_the_gate_and_its_form(web: TestClient, data: FakeData) -> None:
    assert sign_in(web) == 303
    page = web.get("/gates")
    assert page.status_code == 200 and "Ship it?" in page.text
    assert f'action="/gates/{only_gate(data)}/answer"' in page.text


def test_a_token_signs_in_without_a_username_and_as_a_bearer(web: TestClient) -> None:
    assert sign_in(web, username="", password=TOKEN) == 303
    assert web.get("/gates").status_code == 200
    with client_for(SIGNED, FakeData()) as other:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        assert other.get("/gates", headers=headers).status_code == 200
        assert other.get("/gates", headers={"Authorization": "Bearer nope"}).status_code == 303


# -- writing -----------------------------------------------------------------------------------


def test_an_answer_with_the_sessions_csrf_token_is_recorded(
    web: TestClient, data: FakeData
) -> None:
    sign_in(web)
    gate_id = only_gate(data)
    answer = web.post(
        f"/gates/{gate_id}/answer",
        data={"answer": "yes", "csrf": csrf_of(web, "/gates"), "next": "/gates"},
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/gates"
    assert [(str(g), a, by) for g, a, by in data.answered] == [(gate_id, "yes", "admin@console")]
    assert "answered gate" in web.get("/gates").text  # the flash


@pytest.mark.parametrize("token", [None, "", "forged"])
def test_an_answer_without_the_csrf_token_is_refused(
    web: TestClient, data: FakeData, token: str | None
) -> None:
    sign_in(web)
    form = {"answer": "yes"} | ({} if token is None else {"csrf": token})
    answer = web.post(f"/gates/{only_gate(data)}/answer", data=form)
    assert answer.status_code == 403 and "CSRF" in answer.text
    assert data.answered == []


def test_an_anonymous_answer_is_refused_even_with_a_csrf_token(data: FakeData) -> None:
    settings = replace(SIGNED, anonymous_read=True)
    with client_for(settings, data) as web:
        page = web.get("/gates")
        assert page.status_code == 200 and '<form method="post" action="/gates/' not in page.text
        answer = web.post(
            f"/gates/{only_gate(data)}/answer", data={"answer": "yes", "csrf": csrf_of(web)}
        )
        assert answer.status_code == 403 and "sign in first" in answer.text
    assert data.answered == []


def test_signing_in_and_out_need_the_csrf_token(web: TestClient) -> None:
    answer = web.post("/login", data={"username": "admin", "password": PASSWORD})
    assert answer.status_code == 403
    assert web.get("/gates").status_code == 303
    sign_in(web)
    assert web.post("/logout", data={}).status_code == 403
    assert web.get("/gates").status_code == 200
    assert web.post("/logout", data={"csrf": csrf_of(web, "/gates")}).status_code == 303
    assert web.get("/gates").status_code == 303


def test_signing_in_makes_a_new_csrf_token(web: TestClient) -> None:
    before = csrf_of(web)
    sign_in(web)
    assert csrf_of(web, "/gates") != before


def test_a_read_only_console_shows_no_form_and_takes_no_answer(data: FakeData) -> None:
    with client_for(replace(SIGNED, read_only=True), data) as web:
        sign_in(web)
        page = web.get("/gates")
        assert page.status_code == 200 and "/answer" not in page.text and "read-only" in page.text
        answer = web.post(
            f"/gates/{only_gate(data)}/answer",
            data={"answer": "yes", "csrf": csrf_of(web, "/gates")},
        )
        assert answer.status_code == 403
    assert data.answered == []


def test_without_a_configured_secret_the_console_is_read_only_and_open(data: FakeData) -> None:
    with client_for(ConsoleSettings(), data) as web:
        assert web.get("/gates").status_code == 200
        answer = web.post(
            f"/gates/{only_gate(data)}/answer", data={"answer": "yes", "csrf": csrf_of(web)}
        )
        assert answer.status_code == 403
        assert sign_in(web) == 401  # nothing to sign in with
    assert data.answered == []


def test_an_answer_the_gate_does_not_take_is_shown_and_not_recorded(
    web: TestClient, data: FakeData
) -> None:
    sign_in(web)
    answer = web.post(
        f"/gates/{only_gate(data)}/answer",
        data={"answer": "maybe", "csrf": csrf_of(web, "/gates"), "next": "/gates"},
    )
    assert answer.status_code == 303
    assert data.answered == []
    page = web.get("/gates").text
    assert f"maybe is not an answer to gate {only_gate(data)}; valid: yes, no" in page


@pytest.mark.parametrize("target", ["//elsewhere.example/", "https://elsewhere.example/", "x"])
def test_the_return_address_stays_on_the_console(
    web: TestClient, data: FakeData, target: str
) -> None:
    sign_in(web)
    answer = web.post(
        f"/gates/{only_gate(data)}/answer",
        data={"answer": "yes", "csrf": csrf_of(web, "/gates"), "next": target},
    )
    assert answer.headers["location"] == "/"


# -- settings ----------------------------------------------------------------------------------


def test_the_console_binds_beyond_loopback_only_when_allowed() -> None:
    with pytest.raises(SettingsError, match="binds only to loopback"):
        ConsoleSettings(host="0.0.0.0")
    assert ConsoleSettings(host="0.0.0.0", allow_remote=True).host == "0.0.0.0"
    assert ConsoleSettings(host="::1").host == "::1"


def test_the_console_settings_come_from_the_environment(tmp_path: object) -> None:
    env = {
        "VIBEY_CONSOLE_PORT": "9001",
        "VIBEY_CONSOLE_READ_ONLY": "yes",
        "VIBEY_CONSOLE_PASSWORD_HASH": PASSWORD_HASH,
    }
    console = load_settings(env).console
    assert (console.port, console.read_only, console.signs_in) == (9001, True, True)
    assert Access(console).mode.startswith("read-only")
    with pytest.raises(SettingsError, match="VIBEY_CONSOLE_READ_ONLY must be 1 or 0"):
        load_settings({"VIBEY_CONSOLE_READ_ONLY": "perhaps"})
    with pytest.raises(SettingsError, match="not a scrypt hash"):
        load_settings({"VIBEY_CONSOLE_TOKEN_HASH": "plain-text-token"})
