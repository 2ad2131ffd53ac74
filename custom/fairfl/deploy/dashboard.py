"""NVFlare's dashboard (project set-up, user and site sign-up, startup kit downloads) on a workstation.

A real deployment runs the dashboard's container (`nvflare dashboard --start`, needs Docker). This runs the
same Flask app bound to 127.0.0.1 only, with its database in a folder of ours; never `nvflare dashboard
--local`, which binds every interface and writes its database into site-packages.

Once the project is frozen the database holds the project's root CA private key: the folder is owner-only
(0700, its files 0600)."""

from __future__ import annotations

import os
import re
import secrets
import unicodedata
from pathlib import Path

from fairfl.deploy.kits import restrict_folder

HOST = "127.0.0.1"
API = "/nvflare-dashboard/api/v1"
INIT_DONE = ".db_init_done"  # NVFlare writes it once the database is created and the admin seeded
SECRET_KEY_FILE = "secret_key"
DASHBOARD_FILES = {INIT_DONE, SECRET_KEY_FILE, "db.sqlite"}
MIN_PASSWORD_LENGTH = 12
PASSPHRASE_LENGTH = 20  # from this length on a password needs no mix of character kinds (four random words)
# zxcvbn's estimate of the guesses an attacker who knows common passwords, words, names, keyboard walks, dates and
# look-alikes needs: 10^10 is its top score (4), "very unguessable"
MIN_GUESSES_LOG10 = 10
ESTIMATED_LENGTH = 72  # zxcvbn refuses longer input (its cost grows fast); a prefix is never stronger than the whole
MAX_RUN = 4  # this many equal characters in a row (aaaa), or counting up or down (1234, dcba), is a pattern
# the most common password stems, as letters after look-alikes are read (P@ssw0rd: password)
COMMON_STEMS = (
    "password",
    "pass",
    "word",
    "qwerty",
    "asdf",
    "zxcv",
    "letmein",
    "welcome",
    "admin",
    "login",
    "secret",
    "changeme",
    "iloveyou",
    "monkey",
    "dragon",
    "abc",
    "test",
    "user",
    "root",
    "nvflare",
    "flare",
    "dashboard",
    "fairfl",
)
LOOK_ALIKES = str.maketrans("@4310$5!7", "aaeiossit")


def needs_admin(web_root: str) -> bool:
    """Whether starting the dashboard on `web_root` creates its database, and so needs the project admin.
    Refuses a non-empty folder holding no dashboard files: starting would make everything in it owner-only."""
    if os.path.isdir(web_root) and os.listdir(web_root) and not DASHBOARD_FILES & set(os.listdir(web_root)):
        raise ValueError(
            f"{web_root} is not empty and holds no dashboard database: choose an empty or new folder for --root"
        )
    return not os.path.exists(os.path.join(web_root, INIT_DONE))


def _pattern_run(text: str) -> bool:
    """Whether `text` holds MAX_RUN characters in a row that repeat or count up or down by one."""
    steps = [ord(b) - ord(a) for a, b in zip(text, text[1:], strict=False)]
    return any(
        len(set(steps[i : i + MAX_RUN - 1])) == 1 and abs(steps[i]) <= 1 for i in range(len(steps) - MAX_RUN + 2)
    )


def _common_stem(password: str) -> bool:
    """Whether `password` is only common words dressed up: digits and symbols at its ends dropped, look-alikes
    inside read as letters, the rest dropped, what is left is made of COMMON_STEMS (Password1234, P@ssw0rd!)."""
    core = re.sub(r"^[^a-z]+|[^a-z]+$", "", password.lower()).translate(LOOK_ALIKES)
    letters = re.sub(r"[^a-z]", "", core)
    return bool(letters) and re.fullmatch(f"(?:{'|'.join(COMMON_STEMS)})+", letters) is not None


def _guessable(password: str, hints: list[str]) -> str | None:
    """Why zxcvbn estimates `password` (its first ESTIMATED_LENGTH characters) guessable in fewer than
    10^MIN_GUESSES_LOG10 guesses, `hints` (email, organisation, the project's words) counted as known; None if not."""
    from zxcvbn import zxcvbn

    estimate = zxcvbn(password[:ESTIMATED_LENGTH], user_inputs=hints)
    if estimate["guesses_log10"] >= MIN_GUESSES_LOG10:
        return None
    warning = estimate["feedback"].get("warning", "").rstrip(".") or "words, names, dates or patterns"
    return (
        f"it is easy to guess: about 10^{estimate['guesses_log10']:.0f} guesses, at least 10^{MIN_GUESSES_LOG10} "
        f"needed ({warning}); four or more random words make a strong password"
    )


def password_problem(password: str, email: str = "", org: str = "") -> str | None:
    """Why `password` is too weak for the project admin (who can approve sites and download every kit); None if
    it is acceptable: at least 12 printable characters, of at least 3 kinds (lower, upper, digit, other) below
    PASSPHRASE_LENGTH, no run of 4 repeated or counting characters, not only common words, not containing the
    email's user name or the organisation, and at least 10^MIN_GUESSES_LOG10 guesses by zxcvbn's estimate (common
    passwords, keyboard walks such as Qwertyuiop1!, words with a year)."""
    if not password.isprintable():
        return "it holds control characters"
    # judged as the letters it shows: full-width and other compatibility forms (ｐａｓｓｗｏｒｄ) read as their ASCII
    password = unicodedata.normalize("NFKC", password)
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"it has {len(password)} characters; use at least {MIN_PASSWORD_LENGTH}"
    kinds = sum(
        any(test(c) for c in password) for test in (str.islower, str.isupper, str.isdigit, lambda c: not c.isalnum())
    )
    if kinds < 3 and len(password) < PASSPHRASE_LENGTH:
        return (
            "use at least three of: lower-case letters, upper-case letters, digits, other characters (or a "
            f"passphrase of {PASSPHRASE_LENGTH} or more characters)"
        )
    lowered = password.lower()
    for part in (email.split("@")[0], org):
        if len(part) >= 3 and part.lower() in lowered:
            return f"it contains {part!r}"
    if _common_stem(password):
        return "it is a common password with digits or symbols added"
    if _pattern_run(password):
        return f"it has {MAX_RUN} or more characters in a row that repeat or count (aaaa, 1234)"
    if ":" in password or password != password.strip():
        return "it must not contain ':' nor start or end with a space"
    return _guessable(password, [email, email.split("@")[0], org, *COMMON_STEMS])


def make_app(web_root: str, admin_email: str | None = None, password: str | None = None, org: str | None = None):
    """The dashboard's Flask app with its database under `web_root`.

    The project admin (email, password, org) is needed the first time only, to seed the database; a weak password
    is refused (`password_problem`). The password leaves the environment as soon as NVFlare has stored its hash.
    The secret key that signs login tokens is kept in `web_root/secret_key`. Everything in `web_root` is
    readable by the owner only."""
    web_root = os.path.abspath(web_root)
    seeding = needs_admin(web_root)
    if seeding:
        if not (admin_email and password and org):
            raise ValueError(
                f"{web_root} holds no dashboard database yet: give the project admin's email, "
                f"password and organisation to create it"
            )
        problem = password_problem(password, admin_email, org)
        if problem:
            raise ValueError(f"the project admin's password is too weak: {problem}")
        if ":" in admin_email + org:
            raise ValueError("the admin email and organisation must not contain ':'")
    os.makedirs(web_root, mode=0o700, exist_ok=True)
    os.chmod(web_root, 0o700)  # before the database exists: nobody else can reach it, whatever its mode
    key_file = os.path.join(web_root, SECRET_KEY_FILE)
    if not os.path.exists(key_file):
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.environ["NVFL_WEB_ROOT"] = web_root
    os.environ["SECRET_KEY"] = Path(key_file).read_text().strip()
    if seeding:
        os.environ["NVFL_CREDENTIAL"] = f"{admin_email}:{password}:{org}"
    try:
        from nvflare.dashboard.application import init_app  # reads the environment above when first called

        app = init_app()
    finally:
        os.environ.pop("NVFL_CREDENTIAL", None)
        os.environ.pop("SECRET_KEY", None)  # in the app's config now
    restrict_folder(web_root)  # SQLite creates db.sqlite 0644
    return app


def serve(app, web_root: str, port: int) -> None:
    """Serve the dashboard app (of `make_app`) at http://127.0.0.1:PORT until interrupted."""
    print(f"FLARE dashboard on http://{HOST}:{port} (this machine only); database in {web_root}", flush=True)
    app.run(host=HOST, port=port)
