"""The Keras 3 port of train_tf1.py, as a port is often written: the weight decay and the label
smoothing applied in the train step's loss (nothing of them in the model), an unseeded dropout with
a mask of its own on every replica, a custom loop.

    python port.py --data_dir DIR --num_gpus 2 --batch_size 16
"""
import argparse
import os

import keras
import numpy as np
import tensorflow as tf

from modern.resnet_v2 import ReplicaDropout
from modern.runtime import configure_devices, make_strategy

parser = argparse.ArgumentParser()
parser.add_argument("--data_dir", default="/tmp/step_flags_data")
parser.add_argument("--train_dir", default="/tmp/step_flags_train_modern")
parser.add_argument("--num_gpus", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=64, help="global batch")
parser.add_argument("--learning_rate", type=float, default=0.1)
parser.add_argument("--keep_prob", type=float, default=0.8)
parser.add_argument("--weight_decay", type=float, default=0.001)
parser.add_argument("--label_smoothing", type=float, default=0.1)
parser.add_argument("--max_steps", type=int, default=100)


def main() -> None:
    args = parser.parse_args()
    configure_devices(args.num_gpus)
    strategy = make_strategy(args.num_gpus)
    data = np.load(os.path.join(args.data_dir, "train.npz"))
    init = keras.initializers.TruncatedNormal(stddev=0.1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(32, activation="relu", kernel_initializer=init, name="hidden"),
                                  ReplicaDropout(1 - args.keep_prob),
                                  keras.layers.Dense(10, kernel_initializer=init, name="logits")])
        optimizer = keras.optimizers.SGD(args.learning_rate)
    kernels = [layer.kernel for layer in model.layers if hasattr(layer, "kernel")]

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_row = keras.losses.categorical_crossentropy(tf.one_hot(y, 10), model(x, training=True),
                                                            from_logits=True, label_smoothing=args.label_smoothing)
            rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(y)[0])
            decay = args.weight_decay * tf.add_n([tf.nn.l2_loss(k) for k in kernels])
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=rows) + tf.nn.scale_regularization_loss(decay)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(element):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=element), axis=None)

    dataset = tf.data.Dataset.from_tensor_slices((data["images"], data["labels"])).repeat()
    batches = iter(strategy.experimental_distribute_dataset(dataset.batch(args.batch_size, drop_remainder=True)))
    for step in range(args.max_steps):
        loss = train_step(next(batches))
        if step % 10 == 0:
            print(f"step {step}, loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
