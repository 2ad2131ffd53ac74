"""FedISM / FedISM+ (sharpness-aware local training, SALT, and sharpness-aware aggregation, SAGA) for image-quality
shift across sites."""

from fairfl.methods.spec import CLOSEST_ANCESTOR, Claim, Job, MethodSpec, Variant

QUALITY = ("quality_shift",)
SKIN_ROUNDS = {"num_rounds": 100, "eval_every": 10, "dataset": "skin"}
SPEC = MethodSpec(
    name="fedism",
    order=100,
    client_steps=(
        ("fairfl.methods.fedism.client.ProbeModelSent", 80),
        ("fairfl.methods.fedism.client.SALTTraining", 110),
    ),
    doc="methods/fedism.md",
    jobs=(
        Job(
            "fedism",
            "fairfl.methods.fedism.controller.FedISMController",
            server={**SKIN_ROUNDS, "rho_max": 0.05, "tau": 0.0},
        ),
        Job("fedism_plus", "fairfl.methods.fedism.controller.FedISMController", server=SKIN_ROUNDS),
    ),
    variants=(
        Variant("fedism", "FedISM", "fedism", families=QUALITY),
        Variant("fedism_l", "FedISM (L)", "fedism", {"variant": "L"}),
        # FedISM+'s Table I ablation: SALT with FedAvg's weights
        Variant("salt", "SALT (FedAvg weights)", "fedism_plus", {"saga": False}, families=QUALITY),
        Variant("salt_fixed_rho", "SALT, fixed rho (FedAvg weights)", "fedism", {"saga": False}),
        Variant("fedismplus_s", "FedISM+ (S)", "fedism_plus", {"variant": "S"}, families=QUALITY),
        Variant("fedismplus_l", "FedISM+ (L)", "fedism_plus", {"variant": "L"}, families=QUALITY),
    ),
    claims=(
        Claim("FedISM+", "fedismplus_s", "fedavg", "corrupted_auc", "avg", 3.0, family="quality_shift"),
        Claim("FedISM+", "fedismplus_s", "fedavg", "clean_auc", "avg", -1.0, family="quality_shift"),
        Claim("FedISM+", "fedismplus_s", "fedavg", "auc", "std", family="quality_shift"),
        # Table I: SAGA on top of SALT is what makes it fairer across sites
        Claim("FedISM+", "fedismplus_s", "salt", "auc", "std", family="quality_shift"),
        # this project's: SAGA on top of SALT, its closest ancestor, costing at most half a point of the mean
        Claim(CLOSEST_ANCESTOR, "fedismplus_s", "salt", "auc", "avg", margin=-0.5, family="quality_shift"),
    ),
)
