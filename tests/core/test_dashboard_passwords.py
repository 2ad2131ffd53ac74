"""The dashboard admin's password: zxcvbn's estimate refuses keyboard walks and dressed-up common passwords that
passed the character-kind rules, and long passphrases of random words are accepted without digits or capitals."""

import pytest

from fairfl.deploy.dashboard import make_app, password_problem

EMAIL, ORG = "admin@hospital.org", "coordinating_center"
WEAK = [
    "Qwertyuiop1!",  # a keyboard row
    "Password123!",
    "Welcome2024!",
    "Summer2025!!",  # a season and a year
    "1qaz2wsx3edc!Q",  # a keyboard walk down the columns
    "Qazwsxedc123!",
    "Qwertyuiop1!" * 10,  # longer than zxcvbn reads: judged by its first 72 characters
    "ｐａｓｓｗｏｒｄ!2468Ａ",  # full-width letters: read as the ASCII they show
]
PASSPHRASES = [
    "velvet quarry mantis ledger",  # four random words: lower case and spaces only
    "velvetquarrymantisledger",  # lower case only
    "orbit-sandal-pepper-cactus",
    " ".join(["tundra", "mosaic", "pelican", "arbour", "lantern", "quiver"] * 6),  # 200+ characters
]


def test_keyboard_walks_and_common_passwords_with_a_year_are_refused_with_the_estimate():
    accepted = [password for password in WEAK if password_problem(password, EMAIL, ORG) is None]
    assert accepted == []
    why = password_problem("Qwertyuiop1!", EMAIL, ORG)
    assert why.startswith("it is easy to guess: about 10^4 guesses") and "at least 10^10 needed" in why


@pytest.mark.parametrize("password", ["Qwertyuiop1!", "Summer2025!!"])
def test_the_dashboard_refuses_a_guessable_admin_password_before_writing_anything(tmp_path, password):
    with pytest.raises(ValueError, match="too weak: it is easy to guess"):
        make_app(str(tmp_path / "dash"), EMAIL, password, ORG)
    assert not (tmp_path / "dash").exists()


def test_long_passphrases_of_random_words_are_accepted_and_strong_mixed_passwords_still_are():
    assert {p: password_problem(p, EMAIL, ORG) for p in PASSPHRASES} == dict.fromkeys(PASSPHRASES)
    assert password_problem("Harbour-Lights-2026", EMAIL, ORG) is None
    # below 20 characters the kinds still count, and the words must still be unguessable
    assert "three of" in password_problem("velvetquarrymantis", EMAIL, ORG)
    assert "easy to guess" in password_problem("summer summer summer", EMAIL, ORG)
