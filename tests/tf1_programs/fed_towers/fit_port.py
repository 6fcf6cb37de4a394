"""The Keras 3 port of train_tf1.py, trained with model.fit under MirroredStrategy.

    python fit_port.py --data_dir DIR --num_gpus 2 --batch_size 16
"""
import argparse
import os

import keras
import numpy as np
import tensorflow as tf

from modern.runtime import configure_devices, make_strategy

parser = argparse.ArgumentParser()
parser.add_argument("--data_dir", default="/tmp/fed_towers_data")
parser.add_argument("--train_dir", default="/tmp/fed_towers_train_fit")
parser.add_argument("--num_gpus", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=64, help="global batch")
parser.add_argument("--learning_rate", type=float, default=0.1)
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--max_steps", type=int, default=100)


def build_model(hidden: int) -> keras.Model:
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(hidden, activation="relu", name="hidden"),
                             keras.layers.Dense(10, name="logits")])


def main() -> None:
    args = parser.parse_args()
    configure_devices(args.num_gpus)
    strategy = make_strategy(args.num_gpus)
    data = np.load(os.path.join(args.data_dir, "train.npz"))
    dataset = tf.data.Dataset.from_tensor_slices((data["images"], data["labels"])).batch(args.batch_size).repeat()
    with strategy.scope():
        model = build_model(args.hidden)
        model.compile(optimizer=keras.optimizers.SGD(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=args.max_steps, verbose=2)


if __name__ == "__main__":
    main()
