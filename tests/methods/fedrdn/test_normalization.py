"""FedRDN's math (fairfl.methods.fedrdn.normalization) against the paper's rule written out: a site's statistics (the
per-image channel mean and population std, averaged over its images), x' = (x - mu^k) / sigma^k with k drawn for every
image in training and the site's own statistics at test time, for 2-D and 3-D images of 1 and 3 channels; the draw
seeded and covering every site; and the kinds that refuse hostile statistics."""

import math

import numpy as np
import pytest
import torch

from fairfl.methods.fedrdn.normalization import (
    MAX_SITES,
    NormalisedBatches,
    channel_statistics,
    normalise,
    normalising,
    random_normalise,
    record_of,
    statistics_record,
    statistics_set_problem,
    table,
)

SHAPES = {"2-D, 1 channel": (1, 12, 10), "2-D, 3 channels": (3, 12, 10), "3-D, 1 channel": (1, 6, 5, 4)}
SHAPES["3-D, 3 channels"] = (3, 6, 5, 4)


def site_images(shape, count=9, seed=0, scale=(2.0, 0.5, 1.5), shift=(0.3, -1.0, 4.0)):
    """`count` images [count, C, *spatial] of one site's style: channel c scaled and shifted its own way, each image a
    little brighter or darker than the next (per-image statistics differ)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(count, *shape, generator=generator, dtype=torch.float64)
    channels = shape[0]
    view = (1, channels, *([1] * (len(shape) - 1)))
    brightness = torch.linspace(-0.5, 0.5, count, dtype=torch.float64).reshape(count, *([1] * len(shape)))
    scaled = images * torch.tensor(scale[:channels]).reshape(view)
    return scaled + torch.tensor(shift[:channels]).reshape(view) + brightness


def by_hand(images) -> dict:
    """The paper's statistics written out: for each channel, the mean over images of each image's mean, and of each
    image's population std (sqrt of the mean squared deviation from its own mean)."""
    images = images.double()
    channels, record = images.shape[1], {}
    for c in range(channels):
        means, stds = [], []
        for image in images:
            values = image[c].flatten().tolist()
            m = sum(values) / len(values)
            means.append(m)
            stds.append(math.sqrt(sum((v - m) ** 2 for v in values) / len(values)))
        record[f"mean_{c}"], record[f"std_{c}"] = sum(means) / len(means), sum(stds) / len(stds)
    return record


def means_stds(record):
    channels = len(record) // 2
    return (
        torch.tensor([record[f"mean_{c}"] for c in range(channels)], dtype=torch.float64),
        torch.tensor([record[f"std_{c}"] for c in range(channels)], dtype=torch.float64),
    )


# -------------------------------------------------------------------------------------------- a site's statistics
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_sites_statistics_are_the_papers_per_image_averages(shape):
    images = site_images(shape)
    got = channel_statistics([images[:4], images[4:]])
    assert list(got) == list(by_hand(images)) and got == pytest.approx(by_hand(images), rel=1e-12, abs=1e-12)
    # not the pooled std over all the site's pixels: the images differ in brightness, which the pooled one counts
    pooled = images.transpose(0, 1).flatten(1).std(dim=1, correction=0)
    assert not torch.allclose(means_stds(got)[1], pooled, rtol=1e-3)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_sites_statistics_do_not_depend_on_the_order_or_batching_of_its_images(shape):
    images = site_images(shape, count=11, seed=3)
    reference = channel_statistics([images])
    for seed in range(4):
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
        shuffled = images[order]
        cuts = sorted(torch.randint(1, len(images), (2,), generator=torch.Generator().manual_seed(seed)).tolist())
        batches = [shuffled[: cuts[0]], shuffled[cuts[0] : cuts[1]], shuffled[cuts[1] :]]
        assert channel_statistics(b for b in batches if len(b)) == pytest.approx(reference, rel=1e-12, abs=1e-14)
    with pytest.raises(ValueError, match="no images"):
        channel_statistics([])


def test_float32_images_are_accumulated_in_float64():
    images = site_images((1, 64, 64), count=40).float() + 1e4  # float32 sums of many pixels near 1e4 lose digits
    assert channel_statistics(torch.split(images, 3)) == pytest.approx(by_hand(images.double()), rel=1e-9)


# --------------------------------------------------------------------------------------------- the normalisation
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_normalising_with_the_sites_own_statistics_gives_mean_0_and_std_1(shape):
    """The test-time rule: a site's images normalised with its own statistics have, in the same per-image average,
    mean 0 and std 1 in every channel."""
    images = site_images(shape)
    mean, std = means_stds(channel_statistics([images]))
    normalised = normalise(images, mean, std)
    after = channel_statistics([normalised])
    channels = shape[0]
    assert after == pytest.approx(record_of([0.0] * channels, [1.0] * channels), abs=1e-12)
    assert torch.equal(images, site_images(shape))  # the images themselves untouched


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_batch_normalised_with_another_sites_statistics_is_moved_by_exactly_that_sites_mean_and_std(shape):
    """x' = (x - mu^k) / sigma^k: the batch's own per-image statistics (mu, sigma) become ((mu - mu^k) / sigma^k,
    sigma / sigma^k), channel by channel, whatever k's statistics; and a batch of site k's own style comes out with
    mean 0 and std 1: the paper's rule, not a transfer of site k's style onto the batch."""
    channels = shape[0]
    own = site_images(shape, seed=1)
    other = site_images(shape, seed=2, scale=(0.2, 3.0, 0.7), shift=(-2.0, 5.0, 0.0))
    mu, sigma = means_stds(channel_statistics([own]))
    mu_k, sigma_k = means_stds(channel_statistics([other]))
    moved = channel_statistics([normalise(own, mu_k, sigma_k)])
    expected = record_of(((mu - mu_k) / sigma_k).tolist(), (sigma / sigma_k).tolist())
    assert moved == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert channel_statistics([normalise(other, mu_k, sigma_k)]) == pytest.approx(
        record_of([0.0] * channels, [1.0] * channels), abs=1e-12
    )
    # by hand, one voxel: channel c of image 0 at its first position
    for c in range(channels):
        first = own[0, c].flatten()[0]
        assert normalise(own, mu_k, sigma_k)[0, c].flatten()[0] == pytest.approx(float((first - mu_k[c]) / sigma_k[c]))


def test_statistics_of_mean_0_and_std_1_leave_the_images_as_they_are():
    """Where every site's statistics are (0, 1), FedRDN's transform is the identity and FedRDN is FedAvg: fairfl's
    grey 2-D images are z-scored one by one, so the built-in prostate-like sites come out there (docs/methods/
    fedrdn.md)."""
    images = site_images((1, 8, 8)).float()
    means, stds = torch.zeros(3, 1), torch.ones(3, 1)
    out, _ = random_normalise(images, means, stds, torch.Generator().manual_seed(0))
    assert torch.equal(out, images) and torch.equal(normalise(images, means[0], stds[0]), images)


def test_statistics_that_do_not_fit_the_images_are_refused():
    images = site_images((3, 4, 4))
    with pytest.raises(ValueError, match="one mean and std per channel"):
        normalise(images, torch.zeros(1), torch.ones(1))
    with pytest.raises(ValueError, match="one mean and std per channel"):
        normalise(images[0, 0], torch.zeros(4), torch.ones(4))  # no channel dimension
    with pytest.raises(ValueError, match="one pair per channel"):
        record_of([0.0, 1.0], [1.0])


# ---------------------------------------------------------------------------------------------------- the draw
def bank(channels=3, sites=4):
    records = {
        f"site-{i}": record_of([float(i) * (c + 1) for c in range(channels)], [0.5 + i for _ in range(channels)])
        for i in range(1, sites + 1)
    }
    return table(records)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_each_image_is_normalised_with_the_site_drawn_for_it(shape):
    names, means, stds = bank(channels=shape[0])
    images = site_images(shape, count=16)
    out, chosen = random_normalise(images, means, stds, torch.Generator().manual_seed(5))
    assert chosen.shape == (16,) and len(set(chosen.tolist())) > 1  # the sites differ within one batch
    for i, k in enumerate(chosen.tolist()):
        torch.testing.assert_close(out[i : i + 1], normalise(images[i : i + 1], means[k], stds[k]))
    assert names == ["site-1", "site-2", "site-3", "site-4"]


def test_the_draw_is_seeded_uniform_and_covers_every_site():
    _, means, stds = bank(channels=1, sites=5)
    images = torch.zeros(4000, 1, 2, 2)

    def draw(seed):
        return random_normalise(images, means, stds, torch.Generator().manual_seed(seed))[1]

    assert torch.equal(draw(7), draw(7))  # the job's seed repeats it
    assert not torch.equal(draw(7), draw(8))
    counts = torch.bincount(draw(7), minlength=5)
    assert (counts > 0).all() and counts.sum() == 4000
    assert ((counts - 800).abs() < 4 * math.sqrt(4000 * 0.2 * 0.8)).all()  # uniform within 4 standard errors
    # the order the sites' statistics arrive in changes nothing: the table sorts them by name
    records = {f"site-{i}": record_of([float(i)], [1.0 + i]) for i in (3, 1, 2)}
    reordered = dict(sorted(records.items()))
    assert all(torch.equal(a, b) for a, b in zip(table(records)[1:], table(reordered)[1:], strict=True))


def test_normalised_batches_draw_per_image_count_the_draws_and_leave_the_loaders_batches_alone():
    _, means, stds = bank(channels=1, sites=3)
    batches = [
        {"image": site_images((1, 4, 4), count=6, seed=s).float(), "label": torch.arange(6), "case": ["p"] * 6}
        for s in range(5)
    ]
    kept = [b["image"].clone() for b in batches]
    wrapped = NormalisedBatches(batches, means, stds, torch.Generator().manual_seed(1))
    assert len(wrapped) == 5
    again = NormalisedBatches(batches, means, stds, torch.Generator().manual_seed(1))
    for out, same, batch, before in zip(wrapped, again, batches, kept, strict=True):
        assert torch.equal(out["image"], same["image"]) and out["label"] is batch["label"] and out["case"] == ["p"] * 6
        assert torch.equal(batch["image"], before)  # the loader's tensors (a cache's) are never changed in place
    assert wrapped.drawn.sum() == 30 and (wrapped.drawn > 0).all()


def test_a_model_normalising_its_inputs_scores_them_as_if_normalised_first_and_keeps_its_state_dict():
    torch.manual_seed(0)
    network = torch.nn.Sequential(torch.nn.Conv3d(3, 2, 3), torch.nn.ReLU())
    plain = torch.nn.Sequential(torch.nn.Conv3d(3, 2, 3), torch.nn.ReLU())
    plain.load_state_dict(network.state_dict())
    mean, std = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([2.0, 0.25, 1.0])
    images = site_images((3, 6, 5, 4)).float()
    wrapped = normalising(network, mean, std)
    assert wrapped is network and list(wrapped.state_dict()) == list(plain.state_dict())
    torch.testing.assert_close(wrapped(images), plain(normalise(images, mean, std)))


# ---------------------------------------------------------------------------------------- what a site may send
def test_a_sites_statistics_record_refuses_every_hostile_value_naming_the_field():
    kind = statistics_record(3)
    honest = record_of([0.1, -0.2, 0.3], [0.9, 1.1, 0.8])
    assert kind.problem(honest) is None and kind.problem(kind.example()) is None
    for change, named in [
        ({"mean_1": float("nan")}, "mean_1"),
        ({"std_2": float("inf")}, "std_2"),
        ({"std_0": 0.0}, "std_0"),
        ({"std_0": -1.0}, "std_0"),
        ({"std_1": 1e-9}, "std_1"),  # would multiply another site's images a billionfold
        ({"mean_0": 1e30}, "mean_0"),
        ({"mean_0": "0.1"}, "mean_0"),
        ({"std_2": True}, "std_2"),
        ({"std_2": np.array([1.0])}, "std_2"),
        ({"mean_3": 0.0, "std_3": 1.0}, "unknown fields: mean_3, std_3"),  # a fourth channel
    ]:
        problem = kind.problem({**honest, **change})
        assert problem is not None and named in problem, (change, problem)
    problem = kind.problem({k: v for k, v in honest.items() if not k.endswith("_2")})  # two channels only
    assert problem is not None and "lacks mean_2, std_2" in problem
    for bad in ("statistics", [0.1, 1.0], None, 3.0):
        assert kind.problem(bad) is not None


def test_the_set_the_server_sends_is_refused_unless_every_site_has_sound_statistics_of_one_channel_count():
    one, three = record_of([0.0], [1.0]), record_of([0.0, 0.1, 0.2], [1.0, 1.1, 1.2])
    assert statistics_set_problem({"site-1": one, "site-2": record_of([0.3], [0.5])}) is None
    for bad, named in [
        ({}, "1 to"),
        ("x", "1 to"),
        ([one], "1 to"),
        (None, "1 to"),
        ({f"site-{i}": one for i in range(MAX_SITES + 1)}, f"1 to {MAX_SITES}"),
        ({"site-1": one, "site-2": three}, "has 3 channels, another site 1"),
        ({"site-1": {**one, "std_0": 0.0}}, "['site-1'] std_0"),
        ({"site-1": {**one, "mean_0": float("nan")}}, "mean_0 is nan"),
        ({"site-1": {}}, "lacks mean_0, std_0"),
        ({"site-1": "statistics"}, "'site-1'"),
        ({"site-1": {"mean_0": 0.0, "std_0": 1.0, "mean_1": 0.0}}, "unknown fields: mean_1"),
        ({3: one}, "not a site name"),
    ]:
        problem = statistics_set_problem(bad)
        assert problem is not None and named in problem, (bad if len(str(bad)) < 80 else "...", problem)
