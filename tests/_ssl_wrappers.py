"""The multi-view wrappers of self-supervised scripts, each as its script writes it (the tests of
`fastdata.run._views`, which reads them by their code: tests/tools/test_run_views.py,
tests/contract/test_torchvision_faithful.py)."""


class TwoCropsTransform:  # MoCo v1 and v2 (moco/loader.py)
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        q = self.base_transform(x)
        k = self.base_transform(x)
        return [q, k]


class TwoCropsTransformV3:  # MoCo v3 (moco/loader.py)
    """Take two random crops of one image"""

    def __init__(self, base_transform1, base_transform2):
        self.base_transform1 = base_transform1
        self.base_transform2 = base_transform2

    def __call__(self, x):
        im1 = self.base_transform1(x)
        im2 = self.base_transform2(x)
        return [im1, im2]


class ContrastiveLearningViewGenerator(object):  # SimCLR (data_aug/view_generator.py)
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform, n_views=2):
        self.base_transform = base_transform
        self.n_views = n_views

    def __call__(self, x):
        return [self.base_transform(x) for i in range(self.n_views)]


class ContrastiveTransformations:  # the Lightning tutorial's (SimCLR)
    def __init__(self, base_transforms, n_views=2):
        self.base_transforms = base_transforms
        self.n_views = n_views

    def __call__(self, x):
        return [self.base_transforms(x) for _ in range(self.n_views)]


class DataAugmentationDINO(object):  # DINO (main_dino.py): its __call__ as written there
    """Two global crops, then `local_crops_number` local ones. DINO's own __init__ builds the
    three transforms (224 and 96 px, its GaussianBlur and Solarization classes:
    benchmarks/_imagenet_example.py --recipe dino writes it whole); here they are given."""

    def __init__(self, global_transfo1, global_transfo2, local_transfo, local_crops_number):
        self.global_transfo1 = global_transfo1
        self.global_transfo2 = global_transfo2
        self.local_crops_number = local_crops_number
        self.local_transfo = local_transfo

    def __call__(self, image):
        crops = []
        crops.append(self.global_transfo1(image))
        crops.append(self.global_transfo2(image))
        for _ in range(self.local_crops_number):
            crops.append(self.local_transfo(image))
        return crops
