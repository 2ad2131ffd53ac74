"""Classification sites: the settings' classes, and splitting a labelled pool over sites and splits under an
image-quality shift (the FedISM+ and FedNPR setups), shared by the built-in generators and the ISIC 2019 and
RSNA ICH converters.

Sites and quality shift follow the FedISM+ paper and its code (FFL4MIA): a test set of
`test_fraction` (0.2) of the images, stratified by class, is set aside; the rest is split over the sites
by a Dirichlet(alpha) label distribution (`split_by_dirichlet`). The last `round(corrupted_fraction *
num_sites)` sites are corrupted (as in FFL4MIA, whose clients with the highest numbers are): every
training and validation image they hold carries the corruption (Gaussian noise or motion blur,
`fairfl.data.corruption`). As in FFL4MIA, the corrupted group receives the same share of every class
as its share of the sites (4 of 20 sites: 20%), each group split by its own Dirichlet draw, so the
quality shift is not confounded with a shift in data volume or label mix. Each site keeps
`validation_fraction` of its images (stratified) for validation. `split_by_counts` gives a natural split
with missing classes instead of a Dirichlet one (FedNPR's Table I, scaled down).

Test sets (`test_set`): "shared" (the default, the papers' evaluation) gives every site the same test
images: `testing` is the clean test set and `testing_corrupted` the same images with the corruption
applied (one draw per image, shared by all sites). So each site evaluates a model on a clean and a
corrupted test set by loading the splits `testing` and `testing_corrupted` of its own datalist; for a
global model every site reports the same numbers (the papers' "clean" and "corrupted" columns); the
per-site "own quality" value of the papers' Table IV is `testing_corrupted` for the sites listed under
`corruption.sites` in dataset.json and `testing` for the others. "site" instead takes `test_fraction` of
each site's own images (stratified) as its test set (FedNPR's per-client evaluation), again clean in
`testing` and corrupted in `testing_corrupted`.

Layout (`write_classification_sites`): `<root>/<site>/<id>.png` (the site's training and validation
images, corrupted at corrupted sites), `<root>/test/clean/<id>.png`, `<root>/test/<noise|blur>/<id>.png`
and `<root>/<site>.json` datalists ({"image": relative path, "label": class index}); `convert_pool` adds
`<root>/dataset.json` and `<root>/sites.json` for a converted pool.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairfl.classification import class_counts
from fairfl.data.builtin import extra_test_count
from fairfl.data.corruption import Corruption
from fairfl.data.datalist import (
    CORRUPTED_SPLIT,
    SPLITS,
    check_output_folder,
    output_site_names,
    staged_output,
    write_datalist,
)
from fairfl.errors import DataError
from fairfl.names import safe_site_names

TEST_SETS = ("shared", "site")


@dataclass(frozen=True)
class Setting:
    """One classification setting: its classes, their frequencies and how many images the generator draws."""

    name: str
    imitates: str
    classes: tuple[str, ...]  # short names, in label order
    class_names: tuple[str, ...]
    prior: tuple[float, ...]  # class frequencies
    in_channels: int
    images: int  # in all (test set included) at size_scale 1


SKIN_CLASSES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")  # the ISIC 2019 ground-truth columns
ICH_CLASSES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")  # RSNA order

SETTINGS = {
    # ISIC 2019 training set: 4522 MEL, 12875 NV, 3323 BCC, 867 AK, 2624 BKL, 239 DF, 253 VASC, 628 SCC
    "skin": Setting(
        "skin",
        "ISIC 2019 dermoscopy",
        SKIN_CLASSES,
        (
            "melanoma",
            "melanocytic nevus",
            "basal cell carcinoma",
            "actinic keratosis",
            "benign keratosis",
            "dermatofibroma",
            "vascular lesion",
            "squamous cell carcinoma",
        ),
        (0.17, 0.46, 0.13, 0.05, 0.10, 0.03, 0.03, 0.03),
        3,
        2000,
    ),
    # FFL4MIA's ICH selection (train + test): 548, 5127, 3247, 5364, 10714 slices
    "ich": Setting(
        "ich",
        "RSNA intracranial hemorrhage CT (single-type slices)",
        ICH_CLASSES,
        ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural"),
        (0.04, 0.20, 0.13, 0.21, 0.42),
        1,
        1600,
    ),
}


# ----------------------------------------------------------------------------------------------
# splitting a labelled pool over sites and splits (shared with the converters)


def split_by_dirichlet(
    labels: Sequence[int],
    num_sites: int,
    alpha: float,
    rng: np.random.Generator,
    min_per_site: int = 1,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Indices of `labels` per site: for every class, site shares drawn from Dirichlet(alpha, ..., alpha)
    and the class's (shuffled) samples cut in those proportions (Hsu et al. 2019; Li et al.'s NIID-Bench).

    Every sample goes to exactly one site. Smaller `alpha` gives more skewed label distributions (alpha
    -> infinity: every site the global mix). The whole draw is repeated until every site holds at least
    `min_per_site` samples (ValueError after `max_tries`)."""
    labels = np.asarray(labels)
    if num_sites < 1 or alpha <= 0:
        raise ValueError(f"need num_sites >= 1 and alpha > 0, got {num_sites}, {alpha}")
    if min_per_site * num_sites > len(labels):
        raise ValueError(f"{len(labels)} samples cannot give {num_sites} sites {min_per_site} each")
    for _ in range(max_tries):
        sites = [[] for _ in range(num_sites)]
        for label in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == label))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_sites, float(alpha))))[:-1] * len(members)).astype(int)
            for site, part in zip(sites, np.split(members, cuts), strict=True):
                site.extend(part.tolist())
        if min(len(site) for site in sites) >= min_per_site:
            return [np.sort(np.asarray(site, dtype=int)) for site in sites]
    raise ValueError(
        f"no Dirichlet({alpha}) split of {len(labels)} samples gave each of {num_sites} sites "
        f"{min_per_site} in {max_tries} tries: lower min_per_site or raise alpha"
    )


def split_by_counts(labels: Sequence[int], counts, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of `labels` per site, site k getting `counts[k][c]` random samples of class c (a natural
    split with its missing classes, such as FedNPR's Table I). Samples left over are assigned nowhere."""
    labels, counts = np.asarray(labels), np.asarray(counts, dtype=int)
    if counts.ndim != 2 or (counts < 0).any():
        raise ValueError(f"counts must be a [sites, classes] table of non-negative integers, got shape {counts.shape}")
    sites = [[] for _ in range(len(counts))]
    for label in range(counts.shape[1]):
        members = rng.permutation(np.flatnonzero(labels == label))
        if counts[:, label].sum() > len(members):
            raise ValueError(f"class {label}: {counts[:, label].sum()} samples asked for, {len(members)} available")
        for site, part in zip(sites, np.split(members, np.cumsum(counts[:, label])), strict=False):
            site.extend(part.tolist())
    return [np.sort(np.asarray(site, dtype=int)) for site in sites]


def stratified_sample(labels: Sequence[int], fraction: float, rng: np.random.Generator, minimum: int = 1) -> np.ndarray:
    """Positions of round(fraction * n) samples (at least `minimum`, at most n - 1) in proportion to every
    class's size: a systematic sample of the samples ordered by class (random order within a class)."""
    labels = np.asarray(labels)
    n = len(labels)
    k = min(max(minimum, round(fraction * n)), n - 1) if fraction > 0 else 0
    if k <= 0:
        return np.zeros(0, dtype=int)
    order = np.lexsort((rng.random(n), labels))
    step = n / k
    return np.sort(order[np.floor(rng.uniform(0, step) + step * np.arange(k)).astype(int)])


def plan_sites(
    labels: Sequence[int],
    num_sites: int,
    rng: np.random.Generator,
    alpha: float = 1.0,
    num_corrupted: int = 0,
    site_of: Sequence[int] | None = None,
    test_set: str = "shared",
    test_fraction: float = 0.2,
    validation_fraction: float = 0.15,
    min_per_site: int = 3,
    groups: Sequence[str] | None = None,
    fixed_test: Sequence[bool] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Indices of `labels` per site and split: `[{"training", "validation", "testing"}, ...]`.

    Sites come from `site_of` (a site index per sample, -1 to leave a sample out) or else from a
    Dirichlet(alpha) split in which the last `num_corrupted` sites draw from their own share of every
    class (see the module docstring). `test_set` "shared": one stratified test set of all samples, the
    same array in every site's "testing"; "site": each site's own stratified share, or with `fixed_test`
    (True per test sample; needs `site_of`) exactly those samples (a published split). Samples of one group
    (`groups`: a patient, a lesion) stay together in one site and one split; a group counts as its
    most frequent class and as one unit for the fractions and `min_per_site`."""
    if test_set not in TEST_SETS:
        raise ValueError(f"test_set must be one of {TEST_SETS}, got {test_set!r}")
    if fixed_test is not None and (site_of is None or test_set != "site"):
        raise ValueError("a fixed test set needs given sites (site_of) and test_set 'site'")
    if not 0 <= num_corrupted < num_sites or not 0 < test_fraction < 1 or not 0 < validation_fraction < 1:
        raise ValueError("need 0 <= num_corrupted < num_sites and fractions in (0, 1)")
    labels = np.asarray(labels)
    # units: groups of samples that move together, labelled by their most frequent class
    keys = np.asarray(groups) if groups is not None else np.arange(len(labels))
    _, unit_of = np.unique(keys, return_inverse=True)
    votes = np.zeros((unit_of.max() + 1, labels.max() + 1), int)
    np.add.at(votes, (unit_of, labels), 1)
    unit_labels = votes.argmax(1)
    order = np.argsort(unit_of, kind="stable")
    members = np.split(order, np.cumsum(np.bincount(unit_of))[:-1])
    if site_of is not None:
        site_of = np.asarray(site_of)
        unit_site = site_of[[m[0] for m in members]]
        if (site_of != unit_site[unit_of]).any():
            raise ValueError("the samples of one group are at different sites")
    if fixed_test is not None:
        fixed_test = np.asarray(fixed_test, bool)
        unit_test = fixed_test[[m[0] for m in members]]
        if (fixed_test != unit_test[unit_of]).any():
            raise ValueError("the samples of one group are both in the fixed test set and out of it")
    units = np.arange(len(unit_labels))

    shared_test = np.zeros(0, dtype=int)
    if test_set == "shared":
        pool = units if site_of is None else units[unit_site >= 0]
        shared_test = pool[stratified_sample(unit_labels[pool], test_fraction, rng)]
        units = np.setdiff1d(units, shared_test)
    if site_of is None:
        site_units = _dirichlet_sites(units, unit_labels, num_sites, num_corrupted, alpha, rng, min_per_site)
    else:
        site_units = [units[unit_site[units] == k] for k in range(num_sites)]

    plan = []
    for k, mine in enumerate(site_units):
        test = shared_test
        if fixed_test is not None:
            test, mine = mine[unit_test[mine]], mine[~unit_test[mine]]
            if not len(test):
                raise ValueError(f"site {k + 1} has no sample in the fixed test set")
        elif test_set == "site":
            if len(mine) < 3:
                raise ValueError(f"site {k + 1} has {len(mine)} unit(s); a site test set needs 3 at least")
            test = mine[stratified_sample(unit_labels[mine], test_fraction, rng)]
            mine = np.setdiff1d(mine, test)
        if len(mine) < 2:
            raise ValueError(f"site {k + 1} has {len(mine)} unit(s) for training and validation; 2 at least")
        validation = mine[stratified_sample(unit_labels[mine], validation_fraction, rng)]
        training = np.setdiff1d(mine, validation)
        plan.append(
            {
                split: np.sort(np.concatenate([members[u] for u in part] or [np.zeros(0, int)]))
                for split, part in zip(SPLITS, (training, validation, test), strict=True)
            }
        )
    return plan


def _dirichlet_sites(units, unit_labels, num_sites, num_corrupted, alpha, rng, min_per_site) -> list[np.ndarray]:
    """`units` over the sites: the clean sites and the last `num_corrupted` ones each split their group's
    share of every class (num_corrupted / num_sites of it, rounded, for the corrupted group) by Dirichlet."""
    clean, corrupted = [], []
    for label in np.unique(unit_labels[units]):
        of_class = rng.permutation(units[unit_labels[units] == label])
        cut = len(of_class) - round(num_corrupted / num_sites * len(of_class))
        clean.extend(of_class[:cut].tolist())
        corrupted.extend(of_class[cut:].tolist())
    groups = [(np.asarray(clean, int), num_sites - num_corrupted), (np.asarray(corrupted, int), num_corrupted)]
    sites = []
    for members, count in groups:
        if count:
            parts = split_by_dirichlet(unit_labels[members], count, alpha, rng, min_per_site)
            sites += [members[part] for part in parts]
    return sites


def write_classification_sites(
    root: Path,
    plan: Sequence[dict],
    ids: Sequence[str],
    labels: Sequence[int],
    image_of: Callable[[int], np.ndarray | Path],
    site_names: Sequence[str],
    num_classes: int,
    num_corrupted: int = 0,
    corruption: Corruption | None = None,
    seed: int = 0,
) -> dict:
    """Write the images and datalists of `plan` (from `plan_sites`) under `root`; return per-site facts.

    `image_of(i)` gives sample i as a uint8/uint16 array [H, W] or [H, W, C] (written as PNG) or as a file
    path (copied as it is; only where no corruption applies to it). The last `num_corrupted` sites hold
    their training and validation images corrupted; with a `corruption`, every datalist also gets
    `testing_corrupted`, its test images corrupted. The corruption of sample i is drawn from a generator
    seeded by (seed, its id), so it does not depend on the order of writing."""
    from PIL import Image

    labels = np.asarray(labels)
    written: dict[tuple[str, int], str] = {}

    def write(i: int, folder: str, corrupt: bool) -> str:
        if (folder, i) in written:
            return written[(folder, i)]
        try:
            image = image_of(i)
        except DataError as err:  # name the site the image was going to
            raise DataError(site if err.site == "-" else err.site, err.path, err.problem) from err
        if isinstance(image, Path) and not corrupt:
            relative = f"{folder}/{ids[i]}{image.suffix.lower()}"
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image, root / relative)
        else:
            if isinstance(image, Path):
                raise ValueError(f"{ids[i]}: a corrupted copy needs the image as an array, not a file to copy")
            if corrupt:
                image = corruption(image, np.random.default_rng([seed, zlib.crc32(ids[i].encode())]))
            relative = f"{folder}/{ids[i]}.png"
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(root / relative, compress_level=1)
        written[(folder, i)] = relative
        return relative

    corrupted_sites = list(site_names[len(site_names) - num_corrupted :]) if num_corrupted else []
    sites = {}
    for site, parts in zip(site_names, plan, strict=True):
        corrupt = site in corrupted_sites
        splits = {
            split: [
                {"image": write(int(i), site, corrupt and split != "testing"), "label": int(labels[i])}
                for i in parts[split]
            ]
            for split in ("training", "validation")
        }
        splits["testing"] = [
            {"image": write(int(i), "test/clean", False), "label": int(labels[i])} for i in parts["testing"]
        ]
        path = write_datalist(root / f"{site}.json", splits)
        if corruption is not None:
            datalist = json.loads(path.read_text())
            datalist[CORRUPTED_SPLIT] = [
                {"image": write(int(i), f"test/{corruption.kind}", True), "label": int(labels[i])}
                for i in parts["testing"]
            ]
            path.write_text(json.dumps(datalist, indent=1) + "\n")
        sites[site] = dict(
            corrupted=corrupt, class_counts={split: class_counts(labels[parts[split]], num_classes) for split in SPLITS}
        )
    return sites


def convert_pool(
    src: Path,
    dst: Path,
    ids: Sequence[str],
    labels: Sequence[int],
    paths: Sequence[Path],
    description: dict,
    groups: Sequence[str] | None = None,
    sources: Sequence[str | None] | None = None,
    site_names: None | str | Mapping[str, str] = None,
    num_sites: int = 20,
    alpha: float = 1.0,
    image_size: int | None = None,
    mode: str | None = None,
    corrupted_fraction: float = 0.0,
    corruption: str = "noise",
    severity: int = 3,
    test_set: str | None = None,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.15,
    fixed_test: Sequence[bool] | None = None,
    seed: int = 0,
) -> dict:
    """The converters' common part: split a labelled pool of image files over sites and write it to `dst`.

    Sites are the distinct `sources` (a source per sample, None to leave it out; sites in sorted order)
    or, without sources, `num_sites` sites of a Dirichlet(alpha) split named site-1 ... site-N; the last
    `round(corrupted_fraction * number of sites)` are corrupted. `test_set` defaults to "site" with
    sources (each source its own test set) and "shared" without; `fixed_test` (with sources) gives each
    site's test set as published, True per test sample (`test_fraction` unused). `image_size` resizes every
    image to a square PNG (needed for corruption, which is defined at the size the model sees); without it, files
    are copied as they are after a full decode. `mode` converts images (PIL mode, e.g. "RGB") when they
    are rewritten. Output: the layout of `write_classification_sites`, `<dst>/dataset.json`
    (`description` plus the split, `split_used` in words unless `description` has it, the quality shift and
    per-site class counts) and `<dst>/sites.json` (output site -> source). Complete or nothing: written to a
    temporary sibling, renamed into place. Returns `{"sites", "excluded", "split": split_used}`."""
    src, dst, labels = Path(src), Path(dst), np.asarray(labels)
    check_output_folder(dst)
    if corrupted_fraction and image_size is None:
        raise ValueError("corrupted sites need image_size: the corruption is applied at the size the model sees")
    test_set = test_set or ("site" if sources is not None else "shared")
    if sources is not None:
        found = sorted({s for s in sources if s is not None})
        if not found:
            raise DataError("-", src, "no image has a source site")
        names = output_site_names(found, site_names)
        site_of = np.array([-1 if s is None else found.index(s) for s in sources])
        site_list, origin = [names[s] for s in found], found
    else:
        site_of, site_list = None, [f"site-{k + 1}" for k in range(num_sites)]
        if isinstance(site_names, Mapping):
            site_list = list(output_site_names(site_list, site_names).values())
        origin = [f"Dirichlet({alpha:g}) share {k + 1}" for k in range(num_sites)]
    safe_site_names(dict(zip(origin, site_list, strict=True)), src)
    num_corrupted = round(corrupted_fraction * len(site_list))
    quality = Corruption(corruption, severity) if num_corrupted else None
    try:
        plan = plan_sites(
            labels,
            len(site_list),
            np.random.default_rng([seed, 1000]),
            alpha=alpha,
            num_corrupted=num_corrupted,
            site_of=site_of,
            test_set=test_set,
            test_fraction=test_fraction,
            validation_fraction=validation_fraction,
            groups=groups,
            fixed_test=fixed_test,
        )
    except ValueError as err:
        raise DataError("-", src, f"cannot split {len(labels)} images over the sites: {err}") from err

    def image_of(i: int) -> np.ndarray | Path:
        return read_for_output(Path(paths[i]), image_size, mode)

    with staged_output(dst) as staging:
        sites = write_classification_sites(
            staging, plan, ids, labels, image_of, site_list, len(description["classes"]), num_corrupted, quality, seed
        )
        corrupted_sites = site_list[len(site_list) - num_corrupted :] if num_corrupted else []
        for site, source in zip(site_list, origin, strict=True):
            sites[site] = dict(source=source, **sites[site])
        description = dict(
            description,
            split_used=description.get("split_used")
            or f"{'source' if sources is not None else 'Dirichlet'} sites, fairfl's seeded split (seed {seed})",
            source=str(src.resolve()),
            task="classification",
            num_classes=len(description["classes"]),
            image_size=image_size,
            seed=seed,
            split=dict(
                method="source" if sources is not None else "dirichlet",
                alpha=None if sources is not None else alpha,
                test_set=test_set,
                test_fraction=None if fixed_test is not None else test_fraction,
                validation_fraction=validation_fraction,
                grouping="by group (no group in two sites or splits)" if groups is not None else "by image",
            ),
            **quality_description(quality, corrupted_sites, image_size, test_set),
            sites=sites,
        )
        (staging / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")
        (staging / "sites.json").write_text(json.dumps(dict(zip(site_list, origin, strict=True)), indent=1) + "\n")
    return {"sites": sites, "excluded": description.get("excluded", {}), "split": description["split_used"]}


def read_for_output(path: Path, image_size: int | None, mode: str | None) -> np.ndarray | Path:
    """`path` itself (to copy) when `image_size` is None and its mode needs no change, else its pixels
    (in `mode`, resized to `image_size` squared) as uint8 or uint16; the file is fully decoded either
    way, so a truncated file fails here (DataError naming it; `write_classification_sites` adds the site)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
    except Exception as err:  # unreadable, truncated or not an image: say which file
        raise DataError("-", path, f"cannot read image: {err}") from err
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grey (CT exported in Hounsfield units)
        if image_size is None:
            return path
        array = np.asarray(image, dtype=np.float32)
        resized = Image.fromarray(array, "F").resize((image_size, image_size), Image.BILINEAR)
        return np.clip(np.round(np.asarray(resized)), 0, 65535).astype(np.uint16)
    target = mode or (image.mode if image.mode in ("L", "RGB") else "L" if image.mode in ("1", "LA") else "RGB")
    if image_size is None and image.mode == target:
        return path
    image = image.convert(target)
    if image_size is not None:
        image = image.resize((image_size, image_size), Image.BILINEAR)
    return np.asarray(image)


def read_csv(path: Path, required: Sequence[str], site: str = "-") -> list[dict[str, str]]:
    """Rows of a CSV file as dicts (keys stripped); DataError naming the file if it is missing, unreadable
    or lacks a `required` column."""
    import csv

    if not path.is_file():
        raise DataError(site, path, "file not found")
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            header = [name.strip() for name in reader.fieldnames or []]
            rows = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(site, path, f"cannot read CSV: {err}") from err
    missing = [name for name in required if name not in header]
    if missing:
        raise DataError(site, path, f"missing column(s) {', '.join(missing)} (columns: {', '.join(header) or 'none'})")
    return rows


def quality_description(
    corruption: Corruption | None, corrupted_sites: list[str], image_size: int | None, test_set: str
) -> dict:
    """The dataset.json fields that say which sites are corrupted, how, and which splits to evaluate."""
    return dict(
        corruption=None
        if corruption is None
        else dict(
            corruption.parameters(image_size or 224),
            sites=corrupted_sites,
            applied_to="training and validation images of these sites, and every test image in testing_corrupted",
        ),
        corrupted_sites=corrupted_sites,
        test=dict(
            shared=test_set == "shared", clean="testing", corrupted=CORRUPTED_SPLIT if corruption is not None else None
        ),
    )


def add_extra_test_items(
    plan: list[dict], labels: np.ndarray, num_classes: int, test_scale: float, shared: bool
) -> np.ndarray:
    """Enlarge the test sets of `plan` (from `plan_sites`, in place) for `test_scale`: each site's testing gains
    extra_test_count(its size) new samples numbered from len(labels) on (a shared test set once, the same in every
    site), their classes in the proportions of the samples that test set was drawn from (every sample, or the
    site's own), as a stratified test set has them. Returns the new samples' labels."""
    extra, start = [], len(labels)
    for parts in plan[:1] if shared else plan:
        drawn_from = np.unique(np.concatenate([p[split] for p in (plan if shared else [parts]) for split in SPLITS]))
        count = extra_test_count(len(parts["testing"]), test_scale)
        shares = np.bincount(labels[drawn_from], minlength=num_classes) / len(drawn_from)
        extra.append(np.repeat(np.arange(num_classes), largest_remainder(shares * count)))
        parts["testing"] = np.concatenate([parts["testing"], start + np.arange(count)])
        start += count
    if shared:
        for parts in plan:
            parts["testing"] = plan[0]["testing"]
    return np.concatenate(extra).astype(labels.dtype)


def largest_remainder(amounts: np.ndarray) -> np.ndarray:
    """Integers summing to round(sum(amounts)), each the floor or ceiling of its amount."""
    floors = np.floor(amounts).astype(int)
    short = int(round(amounts.sum())) - floors.sum()
    floors[np.argsort(floors - amounts)[:short]] += 1
    return floors
