"""DP-SGD's step (fairfl.privacy.dp_sgd): per-item gradients equal to one-item autograd on 2-D and 3-D MONAI networks,
clipping that bounds any item's contribution, noise of the expected scale, an update that depends on the items drawn
and not on their order, batch norm refused, and a round of train_local with DP on tiny data."""

import math

import pytest
import torch
from monai.networks.nets import SegResNet

from fairfl.models import build_model
from fairfl.privacy.dp_sgd import (
    SeparableLoss,
    clipped_sum,
    drawn_batch,
    per_item_gradients,
    poisson_sample,
    private_gradient,
    secret_generator,
    train_private,
)
from fairfl.privacy.settings import PrivacySettings
from fairfl.training import TrainSettings, segmentation_loss, train_local

UNET = {"channels": [4, 8], "strides": [2]}


def items_2d(k=4, size=16, seed=0):
    """k segmentation items of one 2-D image each: [k, 1, 1, size, size] images and labels."""
    g = torch.Generator().manual_seed(seed)
    labels = (torch.rand(k, 1, 1, size, size, generator=g) > 0.6).float()
    return labels * 2 + 0.3 * torch.randn(k, 1, 1, size, size, generator=g), labels


def one_at_a_time(model, items, labels, loss_fn):
    """Each item's gradient by ordinary autograd on that item alone."""
    found = []
    for image, label in zip(items, labels, strict=True):
        model.zero_grad()
        loss_fn(model(image), label).backward()
        found.append({name: p.grad.clone() for name, p in model.named_parameters()})
    return found


@pytest.mark.parametrize("dims", [2, 3])
def test_per_item_gradients_equal_one_item_autograd_on_2d_and_3d_monai_networks(dims):
    torch.manual_seed(0)
    if dims == 2:
        model, (items, labels) = build_model(UNET).train(), items_2d()
    else:  # a 3-D SegResNet (group norm) on 8^3 patches, two per item (a volume's patches are one record)
        model = SegResNet(
            spatial_dims=3,
            init_filters=4,
            out_channels=2,
            blocks_down=(1, 1),
            blocks_up=(1,),
            norm=("group", {"num_groups": 2}),
        ).train()
        labels = (torch.rand(3, 2, 1, 8, 8, 8) > 0.6).float()
        items = labels + 0.3 * torch.randn(labels.shape)
    loss_fn = segmentation_loss()
    grads, losses = per_item_gradients(model, items, labels, loss_fn)
    expected = one_at_a_time(model, items, labels, loss_fn)
    assert set(grads) == {name for name, _ in model.named_parameters()}
    for i, item_grads in enumerate(expected):
        for name, g in item_grads.items():
            torch.testing.assert_close(grads[name][i], g, rtol=1e-4, atol=1e-6)
    assert losses.shape == (len(items),)


def test_an_item_with_a_huge_gradient_contributes_at_most_the_clip_norm():
    summed = clipped_sum({"w": torch.tensor([[1e6, 0.0], [0.1, 0.0]]), "b": torch.tensor([[0.0], [0.2]])}, clip=1.0)
    torch.testing.assert_close(summed["w"], torch.tensor([1.0 + 0.1, 0.0]))  # the huge one scaled to norm 1
    torch.testing.assert_close(summed["b"], torch.tensor([0.2]))  # the small one (norm < 1) as it is
    # on a real network: an item whose target is 1e4 has a huge gradient, yet alone it adds a vector of norm <= clip
    torch.manual_seed(0)
    model = build_model(UNET).train()
    items, labels = items_2d(2)
    targets = torch.cat([labels, labels], dim=2)  # the U-Net's two output channels
    targets[0] *= 1e4
    grads, _ = per_item_gradients(model, items, targets, torch.nn.functional.mse_loss)
    norm = math.sqrt(sum(float(g[0].pow(2).sum()) for g in grads.values()))
    alone = clipped_sum({name: g[:1] for name, g in grads.items()}, clip=0.5)
    assert norm > 1e3
    assert math.sqrt(sum(float(s.pow(2).sum()) for s in alone.values())) == pytest.approx(0.5, rel=1e-5)


def test_with_zero_gradients_the_update_is_noise_of_std_sigma_clip_over_the_expected_batch():
    model = torch.nn.Linear(64, 64)
    items, labels = torch.randn(5, 1, 64), torch.zeros(5, 1, 64)
    sigma, clip, expected = 1.3, 0.7, 4.0
    g = torch.Generator().manual_seed(1)
    grads, _ = private_gradient(model, items, labels, lambda out, y: (out * 0).sum(), clip, sigma, expected, g)
    noise = torch.cat([v.flatten() for v in grads.values()])
    assert noise.numel() == 64 * 65
    assert float(noise.std()) == pytest.approx(sigma * clip / expected, rel=0.05)
    assert abs(float(noise.mean())) < 5 * sigma * clip / expected / math.sqrt(noise.numel())


def test_the_update_depends_on_the_items_drawn_not_on_their_positions():
    torch.manual_seed(0)
    model = build_model(UNET).train()
    images, labels = items_2d(6)
    dataset = [{"image": images[i, 0], "label": labels[i, 0]} for i in range(6)]
    chosen = poisson_sample(6, 0.5, torch.Generator().manual_seed(1))
    assert 0 < len(chosen) < 6
    permutation = [4, 2, 0, 5, 1, 3]  # position j of the permuted dataset holds item permutation[j]
    shuffled = [dataset[i] for i in permutation]
    matching = torch.tensor([j for j, i in enumerate(permutation) if i in chosen.tolist()])
    updates = []
    for data, drawn in ((dataset, chosen), (shuffled, matching)):
        batch = drawn_batch(data, drawn, lambda items: {k: torch.stack([x[k] for x in items]) for k in items[0]}, "cpu")
        noise = torch.Generator().manual_seed(7)
        updates.append(private_gradient(model, *batch, segmentation_loss(), 1.0, 1.0, 3.0, noise)[0])
    for name, g in updates[0].items():
        torch.testing.assert_close(updates[1][name], g, rtol=1e-5, atol=1e-6)
    # one uniform number per item index: the same generator draws the same items whatever the batch size asks
    assert torch.equal(poisson_sample(6, 0.5, torch.Generator().manual_seed(1)), chosen)


class Loader:
    """What train_private reads of a loader: its dataset and its collate function."""

    def __init__(self, dataset):
        self.dataset = dataset

    @staticmethod
    def collate_fn(items):
        return {k: torch.stack([x[k] for x in items]) for k in items[0]}


def test_batch_norm_is_refused_naming_the_setting_to_change():
    model = build_model({**UNET, "norm": "batch"})
    privacy = PrivacySettings(epsilon=8.0, delta=1e-5, clip=1.0, rounds=2, round=0)
    with pytest.raises(ValueError, match="batch norm .* set model_norm to 'instance' or 'group'"):
        train_private(model, Loader([]), TrainSettings(), "cpu", segmentation_loss(), None, privacy)


def test_a_private_round_trains_states_its_budget_and_adds_the_weights_term_unclipped():
    torch.manual_seed(0)
    images, labels = items_2d(16)
    loader = Loader([{"image": images[i, 0], "label": labels[i, 0]} for i in range(16)])
    settings = TrainSettings(lr=1e-2, batch_size=4, local_steps=3)
    privacy = PrivacySettings(epsilon=8.0, delta=1e-5, clip=1.0, rounds=4, round=1)
    model = build_model(UNET)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    stats = train_local(model, loader, settings, "cpu", privacy=privacy)
    assert stats["steps"] == 3 and "train_loss" not in stats  # the loss is not part of the private model
    assert stats["dp_sample_rate"] == 0.25 and stats["dp_noise_multiplier"] > 0
    assert 0 < stats["dp_epsilon"] < 8.0  # two of four rounds spent
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())
    assert set(model.state_dict()) == set(start)  # no wrapper: the keys the server expects
    # a term of the weights alone reaches the optimiser as it is: with a huge one, plain SGD follows it, not the clip
    model = build_model(UNET)
    pull = SeparableLoss(segmentation_loss(), lambda device: 1e3 * sum(p.pow(2).sum() for p in model.parameters()))
    before = torch.cat([p.detach().flatten() for p in model.parameters()]).norm()
    sgd = TrainSettings(lr=1e-4, batch_size=4, local_steps=1, optimizer="sgd", weight_decay=0.0)
    train_private(model, loader, sgd, "cpu", pull, torch.optim.SGD(model.parameters(), lr=1e-4), privacy, seed=0)
    after = torch.cat([p.detach().flatten() for p in model.parameters()]).norm()
    assert float(after) < 0.9 * float(before)  # each step shrinks by 1 - 2 * 1e3 * 1e-4 = 0.8, beyond any noise


def test_a_step_that_draws_no_item_is_noise_alone_and_the_round_goes_on():
    # what ended a benchmark's site: at q = 1/16 a third of the steps draw no item
    images, labels = items_2d(16)
    loader = Loader([{"image": images[i, 0], "label": labels[i, 0]} for i in range(16)])
    drawn = drawn_batch(loader.dataset, torch.empty(0, dtype=torch.long), loader.collate_fn, "cpu")
    assert [len(t) for t in drawn] == [0, 0]
    sampler = secret_generator("cpu", 3)  # the draws train_private makes with seed 3
    assert any(len(poisson_sample(16, 1 / 16, sampler)) == 0 for _ in range(20))
    settings = TrainSettings(lr=1e-2, batch_size=1, local_steps=20)
    privacy = PrivacySettings(epsilon=8.0, delta=1e-5, clip=1.0, rounds=2, round=0)
    model = build_model(UNET)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    stats = train_private(model, loader, settings, "cpu", segmentation_loss(), optimizer, privacy, seed=3)
    assert stats["steps"] == 20 and any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())
